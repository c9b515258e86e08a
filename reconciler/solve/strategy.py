"""The search: a warm start, the tiers one by one, the cost, a polish, all within a budget of
CP-SAT's deterministic work.

Greedy's answer, completed into a full solution of the model, is every tier's floor. A tier
whose best value the warm start reaches, or whose LP bound it meets, is held without a search;
otherwise CP-SAT searches it from the best answer so far and the value found is held. The cost
stage searches near the LP's answer first (RINS) and stops within the gap of the LP bound; then
the whole model if still outside it; a polish drops instances nothing needs; where the answer's
counts on an offer do not pack, the repair stage packs them instance by instance. A quiet fleet
costs a few short CP-SAT calls (completing the warm start, a polish) and no search.

Deterministic: nothing here reads the clock except the wall-clock safety cap, whose fallback is
greedy's plan."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

from providers.settings import flag
from reconciler.cpsat import cp_model

from reconciler import parallel
from reconciler.errors import SolverError, WallCap
from reconciler.greedy import Assignment, greedy, ranks_above
from reconciler.ledger import MILLI
from reconciler.plan.quality import GREEDY_ONLY, MODEL_INFEASIBLE, WALL_CAP
from reconciler.problem import Host, Problem, components
from reconciler.solve.extract import extract, from_assignment
from reconciler.solve.fewer import fewer_instances
from reconciler.solve import moves, slots
from reconciler.solve.bounds import guaranteed_work_bound, tenant_rows_relaxation
from reconciler.solve.model import Model
from reconciler.solve.objective import CLASS_NAMES, Tier, swap_exemptions
from reconciler.solve.parts import merge_parts
from reconciler.solve.solution import Solution, TierReport
from reconciler.solve.tenants import ceiling_rows
from reconciler.solve.variables import INT64_MAX, INT64_MIN, add_bound, constant, evaluate, flatten, set_full_hints, set_hints

GAP_LIMIT = 0.03  # stop once the cost is provably within 3% of the LP relaxation's bound (--gap)
EXACT_BELOW = 3000  # variables: models this small are solved to optimality (milliseconds), whatever the gap limit
# One CP-SAT worker: its search is a function of the model, the seed and the work limit; a parallel
# portfolio's answer depends on how its threads are scheduled (the same input gave 0 and 2,237
# jobs placed, or another cloud, from one run to the next). Interleaved search is deterministic
# too, but overran its work limit 2x and took 4x the wall time of one worker on the same model.
WORKERS = 1
# The search is bounded by work: CP-SAT's deterministic seconds, counted the same on a busy machine
# as on an idle one. --time-limit T buys T x WORK_PER_SECOND of them: on these models one took 2-3 s
# of CPU (a 1.25 work-second tier search of an 800-job gang fleet: 21.5 s wall at load 12 on
# 2 cores, ~3.6 s of CPU), so T is about the wall time on an idle core. The wall clock is only a
# safety cap, at WALL_FACTOR x T + WALL_SLACK; when it is hit the plan is greedy's, which is
# as deterministic, and says so.
WORK_PER_SECOND = 0.3
WALL_FACTOR, WALL_SLACK = 10.0, 30.0
COMPLETION_SCALE = 2 ** 16  # what a max tier's whole range weighs in the warm start's completion (Search.completion)
# The most a completion stage's sum may reach (Search.completion): CP-SAT refuses an objective or row whose activity may
# pass 2^62 (MODEL_INVALID), and the warm start then fell back to greedy's plan.
STAGE_MAGNITUDE = 2 ** 61
WARM_WORK = (1.0, 0.1)  # work to complete the warm start into a solution of the model: max(1, 0.1 x budget)
FIRST_STAGE_SHARE = 0.8  # of that work, the most the completion's first stage may take (Search.complete)
STAY_PUT_SHARE = 0.2  # of the cost stage's work left, kept for stay_put when running work may move
CONSOLIDATE_SHARE = 0.4  # ... kept for consolidate, while running work is held where it runs
CLAIM_WORK = 0.5  # deterministic s at most for claim_room's search for work a consolidation's room could take
# The repair stage: where an answer's counts on an offer summed per dimension do not pack (the packer would buy
# repairs), those offers get per-instance rows and the packer's packing is checked against every rule, in at most
# REPAIR_WORK deterministic seconds on top of the budget (a plan whose counts pack spends none; 10k jobs: ~0.001); an idle
# class whose hosts do not hold its items the same again (idle_repair).
REPAIR_WORK = 0.1
# The cost stage's work grows with the model past COST_WORK_VARS variables (x2 at twice as many): CP-SAT's work to find
# the same answer grows with the model it propagates. The LP-guided search reaches the gap in 0.49 work-seconds at 10k
# jobs (75k variables), 1.24 at 20k (145k) and 6.9 at 50k (337k), where the budget's cost stage had 6: both its searches
# ran out (77-85 s of CPU) and the plan was greedy's, 12.3% over the bound. Below it, nothing changes.
COST_WORK_VARS = 100_000
TIER_SHARE = 0.25  # of the tiers' work left, the most one tier's search may take (solve_tier)
# Of the budget, the tiers' work; the cost stage (with stay-put and consolidation) has the rest. Where every pool's
# min_instances is its max_instances (a fixed cluster: on-prem or reserved capacity), nothing is bought or sold by
# choice and the instances' cost is the same whatever the answer, so the tiers get most of it: with half, fixed mixed
# clusters' plans after a pool shrink (bench.explore_mixed's fleets 41 and 72) stopped a normal tier short of its
# bound, and the plan after the apply evicted low jobs for normal ones; with 0.8 both plans after the apply are no-ops
# (fleet 41's tier proven at 1,869 where it stopped at 1,834).
TIERS_WORK, FIXED_TIERS_WORK = 0.5, 0.8
# A tier's LP-guided neighbourhood search (tier_lp_guided) may take TIER_RINS_SHARE of the tier's share more, in at
# most RINS_ROUNDS neighbourhoods, each around the last answer found; only in a model of RINS_FROM variables or more
# (below it the whole model's search proves most tiers at once: a 2,697-variable model of a 510-job mixed cluster left
# its normal tier FEASIBLE, and the plan after its apply evicted low jobs for it; the neighbourhood proves it). On
# the 1k-job cluster of mixed node sizes the first neighbourhood reached 1,071 of the low work tier's 1,127 and the
# second 1,127 (proven at the LP bound), 0.72 deterministic s in all. Three quarters, not half: with half, each of
# the three neighbourhoods had 0.12 deterministic s after fleet 208's pool shrink (bench.explore_mixed), and they
# stalled at 1,596 of the 1,617 running normal units; the normal work tier then stopped at 16,030 of 16,170 and the
# plan after the apply evicted two low jobs for normal ones of their tenants (fleet 207 after its priorities changed:
# three). With 0.19 each they reach 1,610, the normal work tier is proven, and both plans after the apply are no-ops.
# The seven bench.digests plans are the same either way. Out of sample neither is better: fleets 301-400 converge 100 of
# 100 with half and 98 with three quarters (308 and 362 after a shrink), fleets 401-500 98 with half (414, 439) and 99
# with three quarters (414); bench/README.md, twelfth and thirteenth sessions.
TIER_RINS_SHARE = 0.75
RINS_ROUNDS = 3
RINS_FROM = 1000
# ... and of at most RINS_MOST: the tier's LP from scratch, which the neighbourhood needs, took 29-80 s a tier on the
# 20k-job drift model (326k columns; reconciler/lp.py), more than the search it would guide. (The bench's 10k drift
# plan, 164k variables, took the same time with the neighbourhood as without; 20k jobs cold ran none, its tiers held.)
RINS_MOST = 200_000
# The cost stage's LP-guided search (lp_guided) first dives along its hint, an LP at every decision, before it searches.
# In a model of DIVE_MOST variables or more it does not: the hint is its first answer already (completed in presolve),
# and the dive's LPs grow with the model. At 50k jobs (337k variables) the dive took 10.2 s to find the hint again and
# the search 7.0 s more to an answer 0.024% over the LP bound; without the dive, 3.9 s to one 0.055% over (the plan
# 63.5 -> 52.7 s end to end, the same tiers). At 20k jobs (145k) the dive pays: 2.0 s and 0.5 s, where without it the
# search took 5.0 s. Measured at those two sizes only.
DIVE_MOST = 200_000
PROBE_WORK = 0.2  # deterministic s at most for place_more's probe
RELAXATION_WORK = 0.2  # deterministic s at most for a guaranteed work tier's bound from the tenants' rows (relaxed_bound)
SWAP_PASSES = 3  # solves of one problem at most: the first, and again while its answer names more stops that are no swaps


def set_objective(m: cp_model.CpModel, flat: tuple[list[int], list[int], int], sense: str, bound: float | None = None) -> None:
    """m's objective: `flat` (variable indices, coefficients, constant) minimized, or maximized (sense "max"), written
    as CP-SAT's own `minimize`/`maximize` writes it (a test checks it); nothing at all: no objective. `bound`: a
    proven bound on it (an upper one for max), as the objective's domain: CP-SAT's search then stops at an answer
    that reaches it instead of proving what is already proven (the bench's 100-job fleet: 3 s of a tier's search)."""
    vs, cs, off = flat
    m.clear_objective()
    if not vs and not off:
        return
    obj = m.proto.objective
    obj.vars.extend(vs)
    sign = -1 if sense == "max" else 1
    obj.coeffs.extend(cs if sign == 1 else [-c for c in cs])
    obj.offset = sign * off
    obj.scaling_factor = float(sign)
    if vs and bound is not None and math.isfinite(bound):
        # (the domain is of the sum without the offset, as minimized: max's sum is -value - off >= -(bound) - off)
        least = sign * (math.floor(bound) if sense == "max" else math.ceil(bound)) - sign * off
        obj.domain.extend([least, INT64_MAX])


class Work:
    """The search's budget in deterministic seconds, spent stage by stage, with the wall clock as
    a safety cap. Every decision reads `used`, which CP-SAT counts deterministically (one worker)."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.used = 0.0

    def solve(self, s: cp_model.CpSolver, m: cp_model.CpModel, work: float) -> int:
        wall = self.deadline - time.monotonic()
        if wall <= 0:
            raise WallCap
        work = max(0.01, work)
        s.parameters.max_deterministic_time = work
        s.parameters.max_time_in_seconds = wall
        st = s.solve(m)
        used = s.response_proto.deterministic_time
        self.used += used
        if st not in (cp_model.OPTIMAL, cp_model.INFEASIBLE) and used < work * 0.999 and s.wall_time >= wall * 0.99:
            raise WallCap  # stopped by the wall clock, not by its work limit
        return st


def solve(problem: Problem, time_limit: float = 20.0, workers: int | None = None, seed: int = 0,
          with_lp_bound: bool = False, gap_limit: float = GAP_LIMIT, decompose: bool = True, processes: int | None = None) -> Solution:
    """Solve with at most time_limit x WORK_PER_SECOND deterministic seconds of CP-SAT work (`Work`); the cost
    stage stops early once within gap_limit of the LP bound. The same problem always gives the
    same solution: nothing here reads the clock except the wall-clock safety cap (WALL_FACTOR),
    whose fallback is greedy's plan. Every tier is at least the warm start's (greedy's), held as
    its floor, and the finished answer is compared with the warm start tier by tier.
    with_lp_bound: also report the LP relaxation's least instance cost at the same tiers (the
    benchmark's yardstick). Independent parts (`components`) each get a share of the work by size,
    and are solved in worker processes where two or more are large (reconciler/parallel.py;
    `processes`: how many, default by the parts' sizes and the CPUs), else one by one."""
    t0 = time.monotonic()
    if time_limit <= 0:  # --time-limit 0: greedy best-fit only
        return from_assignment(problem, greedy_plan(problem), "GREEDY_FALLBACK", t0, note=GREEDY_ONLY)
    clock = Work(t0 + WALL_FACTOR * time_limit + WALL_SLACK)
    work = time_limit * WORK_PER_SECOND
    try:
        if decompose:
            parts = components(problem)
            if len(parts) > 1:
                return solve_parts(parts, work, workers, seed, with_lp_bound, gap_limit, clock, processes)
        return solve_one(problem, work, workers, seed, with_lp_bound, gap_limit, clock)
    except WallCap:
        cap = WALL_FACTOR * time_limit + WALL_SLACK
        return from_assignment(problem, greedy_plan(problem), "GREEDY_FALLBACK", t0,
                               note=f"{WALL_CAP} ({cap:.0f} s) was hit before its work limit (a busy machine?): "
                                    "greedy best-fit, as every run on this input gets when the cap is hit")


def solve_parts(parts: list[Problem], budget: float, workers, seed, with_lp_bound, gap_limit, clock: Work,
                processes: int | None = None) -> Solution:
    """Independent parts, each with a share of the work by size (so no part's answer depends on
    how fast another ran), in worker processes where two or more are large."""
    t0 = time.monotonic()
    sizes = [len(q.demands) + len(q.capacities) + 1 for q in parts]
    shares = [max(0.2, budget * n / sum(sizes)) for n in sizes]
    processes = parallel.processes_for(sizes) if processes is None else processes
    if processes > 1:
        sols = parallel.solve_in_workers(parts, shares, processes, workers, seed, with_lp_bound, gap_limit, clock)
    else:
        sols = [solve_one(q, shares[i], workers, seed, with_lp_bound, gap_limit, clock) for i, q in enumerate(parts)]
    return merge_parts(sols, t0, with_lp_bound)


def warm_start(problem: Problem, move_spot: bool = False) -> Assignment:
    """Greedy best-fit; on a fleet with instances, the fleet as it is completed greedily when it
    is as good (so a quiet fleet is not churned for what greedy alone would rebuild differently). move_spot:
    `greedy_plan`'s."""
    g = greedy(problem, move_spot=move_spot)
    if problem.hosts():
        kept = greedy(problem, keep_fleet=True, move_spot=move_spot)
        if ranks_above(problem, kept, g, ties=True):
            g = kept
    return g


def greedy_plan(problem: Problem) -> Assignment:
    """Greedy's own answer, the plan of every GREEDY_FALLBACK (--time-limit 0, the wall-clock cap, an answer CP-SAT
    could not complete or ranked below its warm start; api.emitted's fallback): the warm start, also moving
    spot-eligible work off spot hosts where the spot share or on-demand buffer breaks (greedy's move_spot). Not CP-SAT's
    warm start, whose search it changed: on trace33 (1,000 trace-shaped jobs, the share lowered 0.5 -> 0.15) CP-SAT's
    counts from it left 4 jobs unpacked, 2 from the plain one."""
    return warm_start(problem, move_spot=True)


def better(a: list[int], b: list[int], tiers: list[Tier]) -> bool:
    """a ranks strictly above b in the lexicographic order of the tiers."""
    for t, x, y in zip(tiers, a, b):
        if x != y:
            return (x > y) if t.sense == "max" else (x < y)
    return False


def proven(lp_value: float, sense: str) -> int:
    """The integer bound an LP optimum proves for an integer objective, loosened by the LP
    solver's tolerances (~1e-7 relative): a bound past the true optimum would cut off plans."""
    slack = 1e-6 + 1e-7 * abs(lp_value)
    return math.floor(lp_value + slack) if sense == "max" else math.ceil(lp_value - slack)


def reaches(value: float, bound: float, sense: str) -> bool:
    return (value >= bound) if sense == "max" else (value <= bound)


def improves(value: float, than: float, sense: str) -> bool:
    return (value > than) if sense == "max" else (value < than)


@dataclass
class Search:
    """One problem's search: its model, its share of the work, the LP mirror, and the answer so far."""

    problem: Problem
    budget: float  # deterministic seconds for this problem
    clock: Work
    n_workers: int
    seed: int
    gap_limit: float
    t0: float = field(default_factory=time.monotonic)
    phases: dict[str, float] = field(default_factory=dict)
    model: Model | None = None
    tiers: list[Tier] = field(default_factory=list)
    cost: object = 0
    lp: object = None  # LpMirror, once the warm start is complete
    spent0: float = 0.0
    rins_work: float = 0.0  # deterministic s the tiers' neighbourhood searches took (tier_lp_guided): not the tiers' share
    warm: list = field(default_factory=list)  # each goal tier's value in the warm start (greedy's answer completed): its floor
    stay_value: float | None = None  # the cost of the best answer found that moves only what must move (stay_put)
    stay_answer: list[int] | None = None  # that answer
    consolidated: bool = False  # consolidate() made the answer: running work moved for cost (Solution.consolidated)
    room_jobs: int = 0  # jobs the consolidated answer places in the room it frees, pending in stay_value's (Solution.room_jobs)
    infeasible: bool = False  # the last `complete` proved its hint cannot be completed
    held_for_now: list = field(default_factory=list)  # the constraint indices of the holds `release` lets go
    tier_rows: list = field(default_factory=list)  # per tier solved: (tier, the constraint rows its holds took: [from, to))
    floors: list = field(default_factory=list)  # the constraint indices of the tiers' other holds (the repair of an idle class lets them go)
    floor_rows: list = field(default_factory=list)  # their rows in the LP (None: held in the model only)
    cost_cuts: list = field(default_factory=list)  # the constraint indices of the cost's cuts (cost >= its bound at the floors)
    lp_rows: int = 0  # changes `hold` and `fix` made to the LP (what cost_lp's answer is for)
    _cost_lp: tuple | None = None
    full: set = field(default_factory=set)  # (part, class) of each work tier held at its bound: all its jobs placed there
    held_work: dict = field(default_factory=dict)  # (part, class) -> the value each work tier solved so far is held at
    # id(expr) -> (expr, its flattened form): each tier and the cost is read ~5 times a solve, and flattening one
    # took 0.07 s at 20k jobs (the expr is kept with it, so its id is not reused while cached)
    _flat: dict = field(default_factory=dict)
    _completion: tuple | None = None  # (the tiers it was made for, `completion`)
    _stage_rows: list = field(default_factory=list)  # the constraint rows `complete` holds the earlier stages' values in

    def __post_init__(self) -> None:
        self.spent0 = self.clock.used
        self._since = self.t0

    @property
    def m(self) -> cp_model.CpModel:
        return self.model.m

    def lap(self, name: str) -> None:
        """Wall seconds since the last lap, added to phase `name` (for the benchmark)."""
        now = time.monotonic()
        self.phases[name] = self.phases.get(name, 0.0) + now - self._since
        self._since = now

    def flat(self, expr) -> tuple[list[int], list[int], int]:
        """`variables.flatten(expr)`, once per expression."""
        hit = self._flat.get(id(expr))
        if hit is None:
            hit = self._flat[id(expr)] = (expr, flatten(expr))
        return hit[1]

    def value(self, values: list[int], expr) -> int:
        """`variables.evaluate(values, expr)`, flattened once."""
        vs, cs, off = self.flat(expr)
        return sum(c * values[i] for i, c in zip(vs, cs)) + off

    def objective(self, m: cp_model.CpModel, expr, sense: str = "min", bound: float | None = None) -> None:
        """`m.minimize(expr)` (or maximize, sense "max"), from its flattened form: the objective CP-SAT's own
        `minimize` writes, without walking the expression again (0.12 s for the cost at 20k jobs). `bound`: a proven
        bound on it (set_objective)."""
        if isinstance(expr, int):  # (a constant: CP-SAT's own way)
            m.maximize(expr) if sense == "max" else m.minimize(expr)
            return
        set_objective(m, self.flat(expr), sense, bound)

    def left(self) -> float:
        """This problem's work left, deterministic seconds."""
        return self.budget - (self.clock.used - self.spent0)

    def solver_for(self, presolve: bool = False, **params) -> cp_model.CpSolver:
        s = cp_model.CpSolver()
        s.parameters.num_workers = self.n_workers
        s.parameters.random_seed = self.seed
        # Presolve costs more than it saves on these models (0.7 s of a 1k-job cost stage) and
        # a complete hint is a solution at once without it.
        s.parameters.cp_model_presolve = presolve
        s.parameters.symmetry_level = 0
        # CP-SAT's own Ctrl-C handler ended the search quietly (the apply then went on with that plan) and set
        # SIGINT back to SIG_DFL afterwards, so a Ctrl-C during apply killed the process holding the lock.
        s.parameters.catch_sigint_signal = False
        for k, v in params.items():
            setattr(s.parameters, k, v)
        return s

    def hold(self, expr, value: int, sense: str, released: bool = False, lp: bool = True) -> None:
        """Keep `expr` at least (max) or at most (min) `value` from now on, in the model and (lp) its LP. `released`:
        in the model only until `release` (a Tier.released), and never in the LP, which so stays a relaxation of the
        model with or without it: its bounds hold after the release, and its basis is not thrown off (held in the LP,
        the moves tiers took the later tiers' warm LPs from 0.03-0.04 to 0.2-0.9 s on the applied 5k fleet)."""
        vs, cs, off = self.flat(expr)
        at = len(self.m.proto.constraints)
        add_bound(self.m, expr, (vs, cs, off), value, sense)
        row = None
        if not released and lp:
            row = self.lp.add(vs, cs, off, value, 2**62) if sense == "max" else self.lp.add(vs, cs, off, -(2**62), value)
            self.lp_rows += 1
        if released:
            if not vs:
                raise SolverError("internal: a released hold has no variable")
            self.held_for_now.append(at)
        elif vs and expr is self.cost:
            self.cost_cuts.append(at)
        elif vs:
            self.floors.append(at)
            self.floor_rows.append(row)

    def let_go_floors(self) -> None:
        """Every tier's floor and the cost's cuts let go, in the model and its LP (their rows stay, bounded by
        nothing): for an answer better by the tiers in their order that some tier below ranks worse in (claim_room).
        The cuts go too: a bound of the cost at the old floors is none at the new ones."""
        let_go(self.m, self.floors + self.cost_cuts)
        for row in self.floor_rows:
            if row is not None:
                row.SetBounds(-self.lp.inf, self.lp.inf)
        self.floors, self.floor_rows, self.cost_cuts = [], [], []
        self.lp_rows += 1  # (the LP changed: cost_lp solves it again)

    def release(self) -> None:
        """Let go of every hold made with `released`: its row stays in the model, bounded by nothing."""
        let_go(self.m, self.held_for_now)
        self.held_for_now.clear()

    def cost_lp(self) -> tuple[float, list[float]] | None:
        """The cost's LP optimum (value, the optimum's values), from scratch, once per state of the LP: consolidate
        asks again what the cost stage asked (0.3-0.8 s at 5k jobs), and no row has been added in between."""
        if self._cost_lp is None or self._cost_lp[0] != self.lp_rows:
            vs, cs, off = self.flat(self.cost)
            self._cost_lp = (self.lp_rows, self.lp.optimum(vs, cs, off, maximize=False, fresh=True))
        return self._cost_lp[1]

    def fix(self, variables: list, values: list[int]) -> None:
        """Each of `variables` at its value in `values` (a full solution), in the model and its LP, for good."""
        for v in variables:
            x = values[v.index]
            dom = self.m.proto.variables[v.index].domain
            if len(dom) != 2:
                raise SolverError(f"internal: variable {v.index} has a domain of several intervals")
            dom[0], dom[1] = x, x
            self.lp.xs[v.index].SetBounds(float(x), float(x))
        self.lp_rows += 1  # (the LP changed: cost_lp solves it again)

    def completion(self) -> list[tuple[list[int], list[int]]]:
        """What `complete` maximizes, stage by stage, each as (variable indices, coefficients).

        With the primaries fixed, what is left is mostly how each tenant's work is split between its guarantee and
        its borrowed part, which the tiers rank in opposite ways, so the stages follow the tiers' order: first the
        guarantees' tiers and the guaranteed part's (each guarantees unit outweighing everything the guaranteed tiers
        can move: their coefficient exceeds those tiers' span, read off the variables' domains), then, with that held,
        the fair share and the borrowed part. In a stage, each max tier is scaled to about COMPLETION_SCALE over its
        bound. One sum was not enough: summed unscaled, the fair share (hundreds of thousands) outweighed the
        guarantees (units): fleet38's warm start counted running critical work as borrowed, 91 of 343 protected units
        kept where greedy's placements keep 294, and the tiers held those floors; scaled, a fair share of 812,500
        (scaled up, never down) still outweighed them: fleet73's warm start put t1's and t2's protected work all on
        borrowed capacity (0 of 168 units each), the tiers held that floor, and the plan after an apply evicted t2's
        guaranteed critical gang for a pool's max_instances."""
        key = tuple((id(t.expr), t.sense) for t in self.tiers)
        if self._completion is not None and self._completion[0] == key:
            return self._completion[1]
        doms = self.m.proto.variables
        cut = next((i for i, t in enumerate(self.tiers) if t.name.startswith(("fair share", "borrowed"))), len(self.tiers))
        first = [t for t in self.tiers[:cut] if t.sense == "max" and t.name.startswith(("guarantees", "protected"))]
        guaranteed = [t for t in self.tiers[:cut] if t not in first]

        def scaled(tiers: list, coef: dict[int, int], above: int = 0) -> int:
            """Add the tiers to coef (each max tier times `above` where given, else scaled); returns their span."""
            moved = 0
            for t in tiers:
                vs, cs, _ = self.flat(t.expr)
                k = -1 if t.sense == "min" else (above or max(1, round(COMPLETION_SCALE / max(1, abs(t.bound)))))
                for v, c in zip(vs, cs):
                    coef[v] = coef.get(v, 0) + k * c
                # (domain[len - 1]: OR-Tools' repeated fields read domain[-1] as 0)
                moved += abs(k) * sum(abs(c) * (doms[v].domain[len(doms[v].domain) - 1] - doms[v].domain[0]) for v, c in zip(vs, cs))
            return moved

        def reach(coef: dict[int, int]) -> int:
            """The most |sum| can be over the variables' domains, as CP-SAT's overflow check reads it."""
            return sum(abs(c) * max(abs(doms[v].domain[0]), abs(doms[v].domain[len(doms[v].domain) - 1])) for v, c in coef.items())

        stages = []

        def stage(coef: dict[int, int]) -> None:
            if any(coef.values()):
                stages.append(([v for v, c in coef.items() if c], [c for c in coef.values() if c]))

        for dominant, rest in ((first, guaranteed), ((), self.tiers[cut:])):
            coef: dict[int, int] = {}
            moved = scaled(rest, coef)
            scaled(dominant, coef, above=moved + 1)
            if dominant and reach(coef) > STAGE_MAGNITUDE:
                # (weighed above the guaranteed tiers' span, the guarantees passed CP-SAT's range: ~7.8e18 at 50k running
                # 8-GPU jobs of priority 1,000,000. A stage of their own, held while those are completed, ranks the same.)
                alone, after = {}, {}
                scaled(dominant, alone)
                scaled(rest, after)
                stage(alone)
                stage(after)
            else:
                stage(coef)
        self._completion = (key, stages)
        return stages

    def complete(self, work: float, fixed: bool = True) -> list[int] | None:
        """A full solution from the hinted primary variables (instances, stays, placements): every
        helper variable set as high as those placements allow in each tier, in the tiers' order (`completion`'s
        stages: the guaranteed part's tiers first, held while the borrowed part's are completed). fixed=False: the
        hint only guides the search (the later stages keep the primaries the first found). Each stage holds every
        earlier one's value. `self.infeasible`: the last call proved no such solution exists."""
        m = self.m
        stages = self.completion()
        used0, sol = self.clock.used, None
        for i, objective in enumerate(stages or [([], [])]):
            if i:
                self.model.set_primary_hint(sol)
                self.stage_hold(i - 1, *stages[i - 1], sol)
            set_objective(m, (*objective, 0), "max")
            s = self.solver_for(fix_variables_to_their_hinted_value=True) if fixed or i else self.solver_for()
            left = work - (self.clock.used - used0)
            # (the first stage most of it: with fixed=False it searches the primaries; a later one fixes them and
            # completes helpers only, 0.01-0.09 deterministic s on a 150-job fleet)
            st = self.clock.solve(s, m, max(0.01, left / (len(stages) - i)) if i else work * (FIRST_STAGE_SHARE if len(stages) > 1 else 1.0))
            m.clear_hints()
            if i == 0:
                self.infeasible = st == cp_model.INFEASIBLE
            if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                break  # (a later stage that runs out keeps the earlier stage's answer)
            sol = list(s.response_proto.solution)
        let_go(m, self._stage_rows)
        return sol

    def stage_hold(self, at: int, vs: list[int], cs: list[int], sol: list[int]) -> None:
        """sum(cs x vs) held at least at its value in `sol`, in the row `complete` keeps for its stage `at` (a row a
        call, let go after, would pile up: the model has no way to drop one)."""
        m = self.m
        while len(self._stage_rows) <= at:
            self._stage_rows.append(len(m.proto.constraints))
            m.proto.constraints.add()
        lin = m.proto.constraints[self._stage_rows[at]].linear
        lin.vars.clear()
        lin.coeffs.clear()
        lin.domain.clear()
        lin.vars.extend(vs)
        lin.coeffs.extend(cs)
        lin.domain.extend([sum(c * sol[v] for v, c in zip(vs, cs)), INT64_MAX])


def solve_one(problem: Problem, budget: float, workers: int | None, seed: int, with_lp_bound: bool, gap_limit: float,
              clock: Work) -> Solution:
    """One problem: the warm start, the tiers, the cost, the polish; never an answer below greedy's. Where the answer
    stops running jobs while their tenant's new work waits (objective.swap_exemptions), those stops are no swaps: the
    problem is solved again, with the same work, with them exempt (at most SWAP_PASSES solves; each pass only adds)."""
    t0 = time.monotonic()
    g = warm_start(problem)
    exempt: dict[str, int] = {}
    for _ in range(SWAP_PASSES):
        sol, found = solve_pass(problem, g, exempt, budget, workers, seed, with_lp_bound, gap_limit, clock, t0)
        if all(v <= exempt.get(k, 0) for k, v in found.items()):
            break
        exempt = {k: max(exempt.get(k, 0), found.get(k, 0)) for k in exempt.keys() | found.keys()}
    return sol


def solve_pass(problem: Problem, g: Assignment, exempt: dict[str, int], budget: float, workers: int | None, seed: int,
               with_lp_bound: bool, gap_limit: float, clock: Work, t0: float) -> tuple[Solution, dict[str, int]]:
    """One solve of `solve_one`: (the solution, the stops its tiers' answer makes that are no swaps)."""
    search = Search(problem, budget, clock, workers or WORKERS, seed, gap_limit, t0=t0)
    if exempt:
        search._since = time.monotonic()  # (the first pass's phases are its own; this one's begin here)
    search.lap("greedy")
    model = search.model = Model(problem, g, exempt=exempt)
    search.tiers = model.tiers()
    search.cost = model.cost()
    search.lap("model")
    if len(model.m.proto.variables) < EXACT_BELOW:
        search.gap_limit = 0.0
    # Warm start: greedy's answer, completed into a full solution of this model. Its tier values
    # are every tier's floor; without them nothing could promise an answer at least greedy's.
    model.hint_from(g)
    best = search.complete(max(WARM_WORK[0], WARM_WORK[1] * budget))
    breaks = best is None and search.infeasible
    if breaks:
        # Greedy's answer breaks a rule the model keeps (fleet26: it gave up the only instance of a pool at its
        # min_instances and could not afford another under the budget: apply's re-check refuses such a plan). Its
        # floors would hold a broken answer, so CP-SAT starts from its own, greedy's answer as a hint only. Only where
        # that is proven: an answer too large to complete in the work keeps greedy's plan (a valid one, the floor).
        model.hint_from(g)
        best = search.complete(max(WARM_WORK[0], WARM_WORK[1] * budget), fixed=False)
    if best is None:
        return from_assignment(problem, greedy_plan(problem), "GREEDY_FALLBACK", search.t0,
                               note=no_warm_start(breaks, search.infeasible)), {}
    warm = [search.value(best, t.expr) for t in search.tiers]
    search.lap("warm start")

    from reconciler.lp import LpMirror

    search.lp = LpMirror(model.m, lambda: search.clock.deadline)
    search.lap("lp")
    cost_hint = best  # greedy chose cheap capacity; tier solutions need not have
    best, reports = solve_tiers(search, best)
    search.lap("tiers")
    found, waiting = swap_exemptions(model, lambda e: search.value(best, e))
    if found and not place_more(search, best, waiting, {model.demands[k].klass for k in found}):
        found = {}  # (solved again, the answer would be the same: the work waits for more than the stops)
    search.lap("swaps probe")
    # The moves tiers (objective.moves_tier) only order what the work tiers may use, and stay held through the cost
    # stage; the answer is judged, and compared with greedy's, by the others.
    goals = [i for i, t in enumerate(search.tiers) if not t.released]
    search.tiers, reports, warm = [search.tiers[i] for i in goals], [reports[i] for i in goals], [warm[i] for i in goals]
    search.warm = warm
    if any(improves(r.value, search.value(cost_hint, t.expr), t.sense) for t, r in zip(search.tiers, reports)):
        cost_hint = None
    hint = cost_hint if cost_hint is not None else best
    search.lap("tiers")
    grow_cost_work(search)
    hint, value, lb, status = cost_stage(search, hint)
    if search.held_for_now:
        hint, value, lb, status, reports = consolidate(search, hint, value, lb, status, reports)
    bound_model = model.m.clone() if with_lp_bound else None  # before the polish's constraints, which only this answer needs
    hint, value = polish(search, hint, value)
    # The answer against the warm start, tier by tier: held floors make it at least as good; if
    # it ever were not, greedy's answer is the plan (never a plan worse than the fallback).
    reached = [search.value(hint, t.expr) for t in search.tiers]
    if better(warm, reached, search.tiers):
        return from_assignment(problem, greedy_plan(problem), "GREEDY_FALLBACK", search.t0, note="CP-SAT's answer ranked below greedy's: greedy best-fit"), found
    sol = finish(search, hint, value, lb, status, reports)
    sol, hint = repair_stage(search, sol, hint, lb, reports)
    if with_lp_bound:
        sol = with_bounds(search, sol, bound_model, hint[:len(bound_model.proto.variables)])
    return replace(sol, phases={k: round(v, 3) for k, v in search.phases.items()}), found


def no_warm_start(breaks: bool, infeasible: bool) -> str:
    """Why CP-SAT has no answer to start from, as the fallback's note says it (`solve_pass`): greedy's answer breaks a
    rule the model keeps (`breaks`, proven) and no plan keeps them all (`infeasible`, proven: no work limit was hit, and
    more would change nothing), or no plan was found within the work; else the work ran out completing greedy's."""
    if breaks and infeasible:
        return MODEL_INFEASIBLE
    if breaks:
        return ("CP-SAT proved greedy's answer breaks a rule its model keeps and found no plan of its own within its work "
                "limit: greedy best-fit")
    return "CP-SAT could not complete greedy's answer within its work limit: greedy best-fit"


def place_more(search: Search, best: list[int], waiting: list, classes: set[int]) -> bool:
    """Could more of the `waiting` new work be placed (objective.swap_exemptions), every tier ranked above the swaps
    tier of the stops' classes held where `best` holds it and the tiers from it on let go? A probe, within PROBE_WORK:
    only then is the problem solved again with the stops exempt. (Holding every tier, a borrowed job of another tenant
    kept in `best` held the room the tenant's guaranteed work would reclaim: the plan after the apply did it. A job
    added to the applied 5k fleet evicts its tenant's lower job, whose tenant waits at its GPU quota: solved again for
    it, the same plan took 2.2 s more; `ceiling_room` leaves such work out.)"""
    room = ceiling_room(search, best)
    waiting = [(d, e) for d, e in waiting if room(d)]
    goal = sum(e for _, e in waiting)
    if isinstance(goal, int):
        return False
    m = search.m  # (in place, the rows put back after: a copy of the applied 5k fleet's model took 0.1 s)
    start = min((i for i, (t, _, _) in enumerate(search.tier_rows) if t.swaps and t.klass in classes), default=None)
    if start is None:
        return False
    held = []
    for _, lo, hi in search.tier_rows[start:]:
        for at in range(lo, hi):
            c = m.proto.constraints[at]
            if c.has_linear() and len(c.linear.domain) == 2:  # (a hold: one interval, as add_bound writes it)
                dom = c.linear.domain
                held.append((at, (dom[0], dom[1])))
                dom[0], dom[1] = INT64_MIN, INT64_MAX
    try:
        search.objective(m, goal, "max")
        set_full_hints(m, best)
        s = search.solver_for()
        st = search.clock.solve(s, m, max(0.05, min(PROBE_WORK, search.left())))
    finally:
        m.clear_hints()
        for at, (lo, hi) in held:
            dom = m.proto.constraints[at].linear.domain
            dom[0], dom[1] = lo, hi
    return st in (cp_model.OPTIMAL, cp_model.FEASIBLE) and s.objective_value > search.value(best, goal) + 0.5


def ceiling_room(search: Search, best: list[int]):
    """d -> would one more of d's jobs keep its tenant within its quota's ceilings in `best` (tenants.ceiling_rows,
    read off the answer)? A probe for work whose tenant is at its quota finds nothing (the applied 5k fleet's raised
    job: 0.3 s of probe for a tenant at 2,161 of 2,161 GPUs)."""
    p, placed = search.model.p, search.model.placed
    rows: dict[str, list[tuple[dict[str, int], int, int]]] = {}  # tenant -> (units per job, most, units placed)

    def rows_of(t: str) -> list[tuple[dict[str, int], int, int]]:
        if t not in rows:
            mine = [e for e in p.demands if e.tenant == t]
            rows[t] = [(coefs, most, sum(c * search.value(best, placed[k]) for k, c in coefs.items()))
                       for coefs, most in ceiling_rows(mine, p.tenants[t].cap)]
        return rows[t]

    def room(d) -> bool:
        if d.tenant not in p.tenants or not p.tenants[d.tenant].cap:
            return True
        return all(used + coefs[d.key] <= most for coefs, most, used in rows_of(d.tenant) if d.key in coefs)
    return room


def grow_cost_work(search: Search) -> None:
    """The work left for the cost stage, grown with the model past COST_WORK_VARS variables (the tiers' is as it
    was); the wall-clock safety cap moves by the same work, at WALL_FACTOR seconds for each work-second bought."""
    grow = len(search.m.proto.variables) / COST_WORK_VARS
    if grow > 1.0:
        more = search.budget * (grow - 1.0)
        search.budget += more
        search.clock.deadline += WALL_FACTOR * more / WORK_PER_SECOND


def solve_tiers(search: Search, best: list[int]) -> tuple[list[int], list[TierReport]]:
    """Each tier in turn, held at the best value found before the next: returns the best answer and the reports."""
    reports: list[TierReport] = []
    for i, tier in enumerate(search.tiers):
        rows = len(search.m.proto.constraints)
        best, report = solve_tier(search, tier, best, len(search.tiers) - i)
        if tier.work is not None and report.value >= tier.bound:
            search.full.add(tier.work)  # (held there: every job of its that weighs is placed in that part)
        if tier.work is not None:
            search.held_work[tier.work] = report.value
        search.tier_rows.append((tier, rows, len(search.m.proto.constraints)))
        reports.append(report)
    return best, reports


def tiers_work(problem: Problem) -> float:
    """The tiers' share of the budget: FIXED_TIERS_WORK on a fixed cluster (every pool's min_instances its max)."""
    bounds = problem.pool_bounds.values()
    return FIXED_TIERS_WORK if bounds and all(lo == hi for lo, hi in bounds) else TIERS_WORK


def solve_tier(search: Search, tier: Tier, best: list[int], tiers_left: int) -> tuple[list[int], TierReport]:
    """One tier: held at once where the warm start reaches its bound or its LP bound; else searched
    from `best` with an even share of the tiers' work left (`tiers_work`)."""
    m, lp = search.m, search.lp
    ts = time.monotonic()
    bound = tier.bound
    hv = search.value(best, tier.expr)
    rel = tier.released
    if reaches(hv, bound, tier.sense):  # the warm start reaches the tier's best value: nothing to solve
        return best, held_at(search, tier, hv, bound, ts)
    if tier.work is not None and tier.work[0] == "guaranteed":
        # (a bound from the tenants' rows alone, where the classes above fill their guarantees: no LP where it holds)
        bound = min(bound, guaranteed_work_bound(search.model, tier.work[1], {c for part, c in search.full if part == "guaranteed"}))
        if reaches(hv, bound, tier.sense):
            return best, held_at(search, tier, hv, bound, ts)
        bound = min(bound, relaxed_bound(search, tier.work[1]))
        if reaches(hv, bound, tier.sense):
            return best, held_at(search, tier, hv, bound, ts)
    vs, cs, off = search.flat(tier.expr)
    res = lp.optimum(vs, cs, off, maximize=tier.sense == "max")
    if res is not None:
        bound = min(bound, proven(res[0], "max")) if tier.sense == "max" else max(bound, proven(res[0], "min"))
    if reaches(hv, bound, tier.sense):
        return best, held_at(search, tier, hv, bound, ts)
    search.hold(tier.expr, hv, tier.sense, rel)  # the floor: what the answer so far (at least greedy's) reaches
    stage1 = search.budget * tiers_work(search.problem)  # work for the tiers; the cost stage has the rest
    # (up to TIER_SHARE of what the tiers have left, at least an even share: a tier that proves its optimum stops early
    # and leaves the rest to the tiers below; the earlier tier ranks first. An even share, 0.33 deterministic s, left
    # fleet73's cold plan at 644 of its 665 guaranteed critical units (FEASIBLE), which 0.4 s proves optimal, and the
    # plan after its apply placed the rest by evicting seven jobs. Half of what is left was too much: g2kr's normal tier
    # found 1,890 more units and its low deadline tier, with less work left, fell from 156,711 to 31,493, 136 fewer
    # jobs placed; at a quarter g2kr's plan is the even share's, and fleet73's first tier is proven)
    used_by_tiers = search.clock.used - search.spent0 - search.rins_work
    left = stage1 - used_by_tiers
    share = max(0.05, left * max(TIER_SHARE, 1 / max(1, tiers_left)))
    # (the neighbourhood's work as with the tiers' half of the budget, on a fixed cluster too: from the larger share,
    # trace-mixed-1k's cold plan took three neighbourhoods of more work where two had proven the same tier, 3.79 s
    # against 1.83 s for the same plan)
    half = max(0.05, (search.budget * TIERS_WORK - used_by_tiers) * max(TIER_SHARE, 1 / max(1, tiers_left)))
    # The LP-guided neighbourhood first, on work of its own (out of the cost stage's half, not the tiers'); then, where
    # it did not reach the bound, the whole model from the answer before it with the tier's whole share, and the
    # better of the two answers. So every tier's whole-model search is what it was without the neighbourhood. (With
    # half the share spent on the neighbourhood and the whole model searched on from its answer, the bench's 100-job
    # tier found another optimum of its tiers, a dearer start for the cost stage: $927.81/h for the same work where
    # this way gives main's $920.31/h.)
    found = None
    if RINS_FROM <= len(m.proto.variables) <= RINS_MOST:
        used0 = search.clock.used
        found = tier_lp_guided(search, tier, best, bound, min(half * TIER_RINS_SHARE, max(0.0, search.left())))
        search.rins_work += search.clock.used - used0
    rins = search.value(found, tier.expr) if found is not None else hv
    if improves(rins, hv, tier.sense) and reaches(rins, bound, tier.sense):  # at the LP's bound: proven, nothing left to search
        search.hold(tier.expr, rins, tier.sense, rel)
        return found, TierReport(tier.name, tier.sense, rins, bound, "OPTIMAL", time.monotonic() - ts)
    search.model.set_full_hint(best)
    search.objective(m, tier.expr, tier.sense, bound)
    s = search.solver_for()
    st = search.clock.solve(s, m, share)
    m.clear_hints()
    if st == cp_model.INFEASIBLE:
        raise SolverError("internal: a tier is infeasible although the warm start reaches every tier held so far")
    if st in (cp_model.OPTIMAL, cp_model.FEASIBLE) and improves(s.objective_value, hv, tier.sense) and not improves(rins, s.objective_value, tier.sense):
        val = round(s.objective_value)
        search.hold(tier.expr, val, tier.sense, rel)
        best = list(s.response_proto.solution)
        # Its other tiers' helper variables are whatever the search left: settle them at their
        # best for these placements, so later tiers are judged on what this answer really reaches.
        search.model.set_primary_hint(best)
        best = search.complete(1.0) or best
    elif improves(rins, hv, tier.sense):
        best, val = found, rins
        search.hold(tier.expr, val, tier.sense, rel)
    else:
        val = hv  # no better answer than the floor, which is held
    proven_bound = s.best_objective_bound if st in (cp_model.OPTIMAL, cp_model.FEASIBLE) else bound
    bound = max(bound, proven_bound) if tier.sense == "min" else min(bound, proven_bound)
    status = "OPTIMAL" if st == cp_model.OPTIMAL else ("FEASIBLE" if st == cp_model.FEASIBLE else "UNKNOWN")
    return best, TierReport(tier.name, tier.sense, val, bound, status, time.monotonic() - ts)


def relaxed_bound(search: Search, c: int) -> float:
    """The guaranteed class-c work tier's bound from the tenants' rows alone, with the classes above held where
    they are (bounds.tenant_rows_relaxation): CP-SAT's bound on that small model after RELAXATION_WORK, valid
    however far its search got (inf: none)."""
    m = tenant_rows_relaxation(search.model, c, {k: v for (part, k), v in search.held_work.items() if part == "guaranteed"})
    if m is None:
        return math.inf
    s = search.solver_for()
    st = search.clock.solve(s, m, RELAXATION_WORK)
    return proven(s.best_objective_bound, "max") if st in (cp_model.OPTIMAL, cp_model.FEASIBLE) else math.inf


def held_at(search: Search, tier: Tier, value: int, bound: float, ts: float) -> TierReport:
    """The tier held at `value`, the warm start's, which reaches `bound`: proven, nothing to search."""
    search.hold(tier.expr, value, tier.sense, tier.released)
    return TierReport(tier.name, tier.sense, value, bound, "HELD", time.monotonic() - ts)


def tier_lp_guided(search: Search, tier: Tier, hint: list[int], bound: float, work: float) -> list[int] | None:
    """RINS for a tier the warm start leaves below its LP bound: a copy of the model where the instances and the
    new items at 0 in both the tier's LP optimum and the answer so far stay 0 (once a neighbourhood holds nothing better,
    but those in the room of its tenant's running lower jobs that pending work may take: `own_lower_room`; from
    fleet 210's state after an edit, the high work tier was proven at 73,500 so, where its neighbourhoods had been
    OPTIMAL at 72,100), searched for the tier with CP-SAT's
    LP-guided search (as `lp_guided` does for the cost); again from a better answer (its support is another
    neighbourhood), at most RINS_ROUNDS times within `work`, each answer valued as the plan's packer would pack it
    (`emitted_value`). Returns the best full answer found (its helper variables settled as `complete` settles them),
    or None. (The full model's search from greedy's answer found nothing better in 13 CPU seconds on a fixed cluster
    of mixed 8/4/2/1-GPU nodes, 1,000 trace jobs: the low work tier at 595 of its bound 1,127, 811 of 887 GPUs used.)
    The LP is solved from scratch: its optimum's values choose the neighbourhood, and a warm solve may end at another
    optimal vertex (`LpMirror._solve`), so the plan would not be a function of its input."""
    vs, cs, off = search.flat(tier.expr)
    res = search.lp.optimum(vs, cs, off, maximize=tier.sense == "max", fresh=True)
    if res is None:
        return None
    lp_values, model, best = res[1], search.model, None
    pairs = list(model.x.values()) + model.use.variables() + model.z.variables()
    end = search.clock.used + work
    opened: set[int] | None = None  # own_lower_room, once a neighbourhood is exhausted below the tier's bound
    n = RINS_ROUNDS
    while n > 0:
        sub = search.m.clone()
        for v in pairs:
            if not isinstance(v, int) and lp_values[v.index] < 1e-6 and hint[v.index] == 0 and not (opened and v.index in opened):
                dom = sub.proto.variables[v.index].domain
                dom[0], dom[1] = 0, 0
        search.objective(sub, tier.expr, tier.sense)
        set_full_hints(sub, hint)
        s = search.solver_for(presolve=True, num_workers=1, linearization_level=2)
        st = search.clock.solve(s, sub, max(0.05, (end - search.clock.used) / n))
        if flag("FLEETOPS_SOLVER_DEBUG"):
            print(f"[solve] {tier.name} lp-guided: {st} {s.objective_value} work {s.response_proto.deterministic_time:.2f} round {n} opened {None if opened is None else len(opened)}", flush=True)
        before = search.value(hint, tier.expr)
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE) or not improves(s.objective_value, before, tier.sense):
            if st == cp_model.OPTIMAL and opened is None:
                # (the neighbourhood holds nothing better: the next ones also keep open the room the pending work may
                # take from its own tenant's running lower jobs, as a round more; opened from the first, the
                # neighbourhoods grew and three fleets that converge did not: bench/README.md, twelfth session)
                opened = own_lower_room(model)
                if opened:
                    continue
            break
        found = list(s.response_proto.solution)
        emitted = emitted_value(search, tier, found, round(s.objective_value))
        if emitted is None or not improves(emitted, before, tier.sense):
            if flag("FLEETOPS_SOLVER_DEBUG"):
                print(f"[solve] {tier.name} lp-guided: its answer packed reaches {emitted}, not taken", flush=True)
            break
        hint = best = found
        if reaches(s.objective_value, bound, tier.sense) or end - search.clock.used < 0.05:
            break
        n -= 1
    if best is None:
        return None
    search.model.set_primary_hint(best)
    return search.complete(1.0) or best


def own_lower_room(model: Model) -> set[int]:
    """The indices of the new-item variables on a host where a running job runs whose tenant has pending work of a
    higher class in the variable's group: room that work may take (a tenant's higher class before its lower ones)."""
    out: set[int] = set()
    for (gk, ck), v in model.x.items():
        pairs = model.pending_of.get(gk)
        h = model.caps.get(ck)
        if not pairs or isinstance(v, int) or not isinstance(h, Host):
            continue
        for dk, _, _ in h.residents:
            d = model.demands.get(dk)
            if d is not None and d.running_jobs and any(t == d.tenant and k > d.klass for t, k in pairs):
                out.add(v.index)
                break
    return out


def beyond_count(search: Search, vec: list[int]) -> list[tuple[str, int]] | None:
    """What answer `vec` puts on rows summed over many instances that does not pack instance by instance: each
    offer's new instances as the plan's packer packs them, the items beyond its count, as (group, items); None where an
    idle class's kept hosts do not hold theirs (`extract.unfold_idle`, what `idle_repair` asks). An LP-guided answer
    fills an offer's summed rows to the last unit where the packer cannot: under a budget that buys no repair
    (g1k-b6k) 24 jobs were left unpacked, critical ones among them, and the plan fell back to greedy's, 373 jobs placed
    where the whole model's search placed 712."""
    from reconciler.plan.packing import offer_packing  # (the plan's packer: the plan imports the solver only to annotate)
    from reconciler.solve.extract import placements, unfold_idle

    _, _, x, keep = placements(search.problem, search.model, vec)
    if unfold_idle(search.model, x, keep)[1]:
        return None
    sol = extract(search.problem, search.model, vec, [], "FEASIBLE", False, 1.0, search.t0)
    out: dict[str, int] = {}
    for ok, insts in offer_packing(search.problem, sol).instances.items():
        for inst in insts[sol.new.get(ok, 0):]:
            for _, gk, n in inst:
                out[gk] = out.get(gk, 0) + n
    return sorted(out.items())


def emitted_value(search: Search, tier: Tier, vec: list[int], value: int) -> int | None:
    """A work tier's `value` in answer `vec` less what the packer leaves over (`beyond_count`), or None where that
    could be anything but this tier's own new work or lower: the tier's demands must be of one class, and each group
    left over must have that many new jobs placed of that class or lower (the packer's leftovers go lowest class
    first), each counted at the most a job of the group weighs in the tier. (The heterogeneous A100 cluster, 271 / 135
    / 90 / 113 nodes of 1 / 2 / 4 / 8 GPUs, 2,000 trace jobs: the neighbourhood's answer raised the low work tier from
    1,435 to 2,128 and left one item over on the 135 summed 2-GPU nodes; refused for that, the plan used 92.6% of the
    GPUs.)"""
    left = beyond_count(search, vec)
    if left is None:
        return None
    if not left:
        return value
    if tier.sense != "max":
        return None
    model = search.model
    at = set(search.flat(tier.expr)[0])
    mine = {dk for vals in (model.placed, model.g, model.b) for dk, v in vals.variable_items() if v.index in at}
    classes = {model.demands[dk].klass for dk in mine}
    if len(classes) != 1:
        return None
    (c,) = classes
    loss = 0
    for gk, n in left:
        members = [model.demands[dk] for dk in search.problem.groups[gk]]
        new = sum(model.placed.solved(d.key, vec) for d in members if d.klass <= c and not d.running)
        if new < n:
            return None
        loss += n * max((d.weight for d in members if d.key in mine), default=0)
    return value - loss


def cost_stage(search: Search, hint: list[int]) -> tuple[list[int], float | None, float | None, str]:
    """Cost, with every tier held: the LP bound (added as a cut), then a search restricted to what the
    LP uses, then the whole model while still outside the gap. Returns (answer, its cost, bound, status)."""
    cost = search.cost
    fixed = constant(cost) is not None  # no variable in the cost: nothing to search for it
    # From scratch: its answer's values guide lp_guided. From the tiers' last basis it took 26 s of CPU where a fresh
    # solve takes ~68 (20k-job drift) but can end at another optimal vertex, and another plan of the same cost
    # (examples/ml-platform: OPTIMAL at $199/h both ways, other placements).
    res = search.cost_lp()
    lb = res[0] if res is not None else None
    if lb is not None and not fixed:
        # A valid cut (cost >= lb): CP-SAT's own bound starts there (the LP has no released hold: valid after them too)
        search.hold(cost, proven(lb, "min"), "max", lp=False)
    search.lap("lp")
    status, value = "UNKNOWN", None
    hint_value = search.value(hint, cost) if not fixed else None
    if hint_value is not None and lb is not None and hint_value - lb <= search.gap_limit * max(hint_value, 1):
        value = hint_value  # already within the gap of the bound: no search, so no churn for crumbs
    elif res is not None:
        found = lp_guided(search, hint, res[1])
        if found is not None:
            (hint, value), status = found, "FEASIBLE"
        search.lap("cost: lp-guided")
    if value is None and not fixed:
        value = search.value(hint, cost)
    if flag("FLEETOPS_SOLVER_DEBUG"):
        print(f"[solve] lb={lb} after lp-guided: {status} value={value}", flush=True)
    may_move = not fixed and search.model.p.placement.consolidation != "WhenEmpty" and bool(search.model.moved)
    # the work stay_put may need at the end, or, while moves are held, what consolidate may need after
    reserve = search.left() * (CONSOLIDATE_SHARE if search.held_for_now else STAY_PUT_SHARE) if may_move else 0.0
    if not fixed and (lb is None or value is None or (value - lb) > search.gap_limit * max(value, 1)) and search.left() - reserve > 0.1:
        hint, value, lb, status = full_search(search, hint, value, lb, status, reserve)
        search.lap("cost: full model")
    if may_move:
        found = stay_put(search, hint, value)
        if found is not None:
            hint, value = found
            status = status_of(value, lb)
        search.lap("cost: stay put")
    return hint, value, lb, status


def consolidate(search: Search, hint: list[int], value: float | None, lb: float | None, status: str,
                reports: list[TierReport]) -> tuple[list[int], float | None, float | None, str, list[TierReport]]:
    """Consolidation: the answer found with running work held where it runs (but for what a rule moves and what a
    higher class needs: objective.moves_tier), against the cost stage run again with running work free to move. The
    holds are let go, so the bound is the cheapest the fleet could be at the same tiers; where the answer is within
    the gap of it, it stands (no churn for crumbs). Else the moves the cost stage finds are made where they pay at the
    same work (a move's cost is in the cost, amortised over payback_hours), and the room they free goes to pending
    work (`claim_room`): a running job moves for cost, or for a higher class, never to make room for its own class
    or a lower one alone. (An applied 1k-job fleet under a $6,000/h budget, re-planned unchanged, had moved 8 running
    jobs to fund 15 more jobs of their classes, labelled a consolidation at $2.10/h more. A consolidation that
    freed a pool slot left a pending job beside it, "the solver did not find that placement", for the next plan.)
    Returns (answer, cost, bound, status, tier reports)."""
    search.release()
    if constant(search.cost) is not None or value is None or search.model.p.placement.consolidation == "WhenEmpty":
        return hint, value, lb, status, reports
    held, held_value, held_stay = hint, value, (search.stay_value, search.stay_answer)
    restore = keep_running(search, held)
    try:
        hint, value, lb, status = cost_stage(search, held)
    finally:
        restore()
    search.lap("consolidate")
    # (Crumbs: a saving within the gap limit of the held answer's cost is no consolidation. A cold plan stops within that
    # gap of its bound, so the plan right after its apply, whose best answer is no cheaper than that bound, never moves
    # for less: an applied 17-job fleet's next plan moved 3 jobs and swapped 2 instances for one, cents an hour, fleet36.)
    if value is None or value >= held_value - 0.5 or held_value - value <= search.gap_limit * max(held_value, 1):
        search.stay_value, search.stay_answer = held_stay
        return held, held_value, lb, status_of(held_value, lb) if lb is not None else status, reports
    search.consolidated = True
    claimed = claim_room(search, hint)
    if claimed is None:
        return hint, value, lb, status, reports
    # The consolidated answer with its freed room taken: each tier held at what it reaches (a tier it raised is not
    # proven best: its bound was the held answer's), then the cost, every running job kept and free to move for cost
    # again. (With the consolidation's stays fixed, the work the room took was priced around them: two p4d at $55.20/h,
    # and the plan after the apply moved five jobs to reach $36.85/h, fleet70.)
    reached = [search.value(claimed, t.expr) for t in search.tiers]
    # A tier below one it raised may rank worse (a higher class took a lower one's room): the floors it is under go,
    # and so does the bound of the cost at them. The cost's LP at the tiers it reaches, with running work free to
    # move as the bound was, is the bound then.
    lowered = any(improves(r.value, v, t.sense) for t, r, v in zip(search.tiers, reports, reached))
    if lowered:
        search.let_go_floors()
    for t, v in zip(search.tiers, reached):
        search.hold(t.expr, v, t.sense)
    if lowered:
        res = search.cost_lp()
        lb = res[0] if res is not None else None
    out = [r if v == r.value else TierReport(r.name, r.sense, v, None, "FEASIBLE", r.seconds) for r, v in zip(reports, reached)]
    restore = keep_running(search, claimed)
    try:
        hint, value, _, _ = cost_stage(search, claimed)  # (the plan is measured against lb)
    finally:
        restore()
    # No answer keeping running work where it runs places this work: what the moves save is measured against the held
    # answer, which leaves it pending, and the plan says how many jobs the freed room runs (Consolidation.room_jobs). (It
    # said "not measured", and the JSON null, on a 500-job trace fleet whose plan saved $51.56/h: audit33.) Not its
    # answer: finish_or_stay's choice is between answers at the same tiers.
    search.stay_value, search.stay_answer = held_value, None
    search.room_jobs = sum(max(0, search.model.placed.solved(k, hint) - search.model.placed.solved(k, held)) for k in search.model.placed)
    search.lap("consolidate")
    return hint, value, lb, status_of(value, lb) if lb is not None else status, out


def keep_running(search: Search, answer: list[int]):
    """Every running job `answer` keeps, kept (the lower bounds of the kept-jobs variables, in the model only: the LP
    stays a relaxation): a consolidation moves work for cost and stops none of it. With the moves tiers let go, the
    swaps tiers go too, and the cost stage, at the same tiers, stopped t3's running spot-never j5 for t3's j4, which a
    removed pool moved, to put both on a cheaper spot p4d: a stop for its tenant's own work of its class, which apply's
    re-check refused (fleet64). The room a consolidation frees goes to pending work after it (claim_room). Returns
    the function that puts the bounds back."""
    saved = []
    for v in search.model.krj.variables():
        dom = search.m.proto.variables[v.index].domain
        saved.append((dom, dom[0]))
        dom[0] = max(dom[0], answer[v.index])

    def restore() -> None:
        for dom, lo in saved:
            dom[0] = lo
    return restore


def let_go(m: cp_model.CpModel, rows: list[int]) -> None:
    """Holds let go in model m: each row stays, bounded by nothing (two bounds: one interval, as add_bound writes it)."""
    for at in rows:
        dom = m.proto.constraints[at].linear.domain
        dom[0], dom[1] = INT64_MIN, INT64_MAX


def claim_room(search: Search, answer: list[int]) -> list[int] | None:
    """An answer better by the tiers than `answer`, in their order, with its running work where `answer` puts it
    (every stay as it has it): the tiers searched again one by one on a copy of the model, each held where its
    search leaves it before the next, from `answer` and within CLAIM_WORK in all, so room it does not find is room
    the next plan may fill (new work, no move). The floors the tiers set before the moves are let go: a higher class
    may take room that a lower class's new work has in `answer`, as the tiers would have given it had the room been
    free when they were solved. (Each tier held at least at its floor, a consolidation's room went to t1's low j3
    while its normal j7 waited, and the plan after the apply evicted j3 for j7: fleet58.) None if it finds none."""
    tiers = search.tiers
    if not tiers:
        return None
    sub = search.m.clone()
    for v in search.model.stay.variables():
        dom = sub.proto.variables[v.index].domain
        dom[0], dom[1] = answer[v.index], answer[v.index]
    let_go(sub, search.floors + search.cost_cuts)
    best, spent = answer, 0.0
    for k, t in enumerate(tiers):
        v = search.value(best, t.expr)
        if not reaches(v, t.bound, t.sense) and spent < CLAIM_WORK:
            search.objective(sub, t.expr, t.sense)
            set_full_hints(sub, best)
            s = search.solver_for()
            st = search.clock.solve(s, sub, max(0.02, min((CLAIM_WORK - spent) / (len(tiers) - k), search.left())))
            spent += s.response_proto.deterministic_time
            sub.clear_hints()
            if st in (cp_model.OPTIMAL, cp_model.FEASIBLE) and improves(s.objective_value, v, t.sense):
                best = list(s.response_proto.solution)
                v = search.value(best, t.expr)
        add_bound(sub, t.expr, search.flat(t.expr), v, t.sense)
    if not better([search.value(best, t.expr) for t in tiers], [search.value(answer, t.expr) for t in tiers], tiers):
        return None
    return best


def lp_guided(search: Search, hint: list[int], lp_values: list[float]) -> tuple[list[int], float] | None:
    """RINS: a search of a copy of the model where the variables at 0 in both the LP's answer and
    the hint stay 0. Returns (answer, its cost), or None if it found none."""
    model = search.model
    sub = search.m.clone()
    for v in list(model.x.values()) + model.use.variables():
        i = v.index
        if lp_values[i] < 1e-6 and hint[i] == 0:
            dom = sub.proto.variables[i].domain
            dom[0], dom[1] = 0, 0
    search.objective(sub, search.cost)
    set_full_hints(sub, hint)
    # One worker, CP-SAT's LP-guided search, which is what finds good answers in this small
    # neighbourhood (2 workers gave 12.8k-14.0k $/h at 1k jobs depending on the seed; 1 gives
    # 12.8k). It stops once within the gap of the LP bound (the cut above is in the clone):
    # about 0.2 s at 1k jobs, 2.3 s at 5k; up to half the work left otherwise.
    s = search.solver_for(presolve=True, num_workers=1, linearization_level=2,
                          relative_gap_limit=search.gap_limit, log_search_progress=flag("FLEETOPS_SOLVER_DEBUG"))
    if len(sub.proto.variables) >= DIVE_MOST:
        s.parameters.hint_conflict_limit = 0  # (no dive along the hint first: DIVE_MOST)
    st = search.clock.solve(s, sub, max(0.1, search.left() * 0.5))
    if st in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return list(s.response_proto.solution), s.objective_value
    return None


def stay_put(search: Search, hint: list[int], value: float) -> tuple[list[int], float] | None:
    """Where the answer moves running work it need not move, the best answer that moves only what
    must move (WhenEmpty's rule, every tier held): its cost is what the moves are judged against
    (`Solution.stay_value`: the plan's consolidation line says what the moves save, instances,
    egress and latency together), and it is the answer if it costs less, moves' amortised cost
    included. Returns (answer, cost) in that case, else None. (On an applied 1k-job fleet whose
    tenants' GPU quotas doubled, 69 moves cost $1.91/h more in instances than staying put and
    saved $229/h of egress and latency: the plan said only "at $80.60/h more".)"""
    model = search.model
    limit = moves.must_move(model)
    if all(evaluate(hint, mv) <= limit[dk] for dk, mv in model.moved.items()):
        return None
    sub = search.m.clone()
    moves.add_only_forced_moves(model, sub)
    search.objective(sub, search.cost)
    set_full_hints(sub, hint)
    s = search.solver_for(presolve=True, num_workers=1, linearization_level=2, relative_gap_limit=search.gap_limit)
    st = search.clock.solve(s, sub, max(0.1, search.left()))
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    search.stay_value = s.objective_value
    search.stay_answer = list(s.response_proto.solution)
    if s.objective_value < value - 0.5:
        return list(s.response_proto.solution), s.objective_value
    return None


def full_search(search: Search, hint: list[int], value: float | None, lb: float | None, status: str, reserve: float = 0.0):
    """The whole model, from `hint`, with the work left but `reserve`: returns (answer, cost, bound, status), improved or as given."""
    m = search.m
    search.objective(m, search.cost)
    search.model.set_full_hint(hint)
    s = search.solver_for(relative_gap_limit=search.gap_limit)
    st = search.clock.solve(s, m, search.left() - reserve)
    m.clear_hints()
    if st in (cp_model.OPTIMAL, cp_model.FEASIBLE) and s.objective_value <= (value if value is not None else math.inf):
        hint, value = list(s.response_proto.solution), s.objective_value
        lb = max(lb or 0.0, s.best_objective_bound)
        # CP-SAT says OPTIMAL once within relative_gap_limit: optimal means no gap at all.
        status = status_of(value, lb)
    elif st == cp_model.INFEASIBLE:
        raise SolverError("internal: the cost stage is infeasible although every tier was reached")
    return hint, value, lb, status


def polish(search: Search, hint: list[int], value: float | None) -> tuple[list[int], float | None]:
    """With every placement fixed, buy no instance they do not need (a search stopped at the gap
    can leave one idle). It only takes away: buying more of an offer to give up instances the
    fleet has would be churn the search above did not choose."""
    if constant(search.cost) is not None:
        return hint, value
    m, model = search.m, search.model
    rows = len(m.proto.constraints)
    for o in model.offers:
        m.add(model.use[o.key] <= hint[model.use[o.key].index])
    # (with the slots' items too: left free, the polish had to pack the trace-shaped fixed cluster's 844 jobs onto
    # its 111 slots again and found nothing in its 0.5 s of work, 1.8 s of wall time)
    placements = model.stay.variables() + list(model.x.values()) + model.placed.variables() + model.z.variables()
    set_hints(m, [(v.index, hint[v.index]) for v in placements])
    search.objective(m, search.cost)
    s = search.solver_for(fix_variables_to_their_hinted_value=True)
    st = search.clock.solve(s, m, min(0.5, max(0.1, search.left())))
    m.clear_hints()
    for i in range(rows, len(m.proto.constraints)):
        m.proto.constraints[i].clear_linear()  # (its bounds are this answer's only: the repair stage buys more)
    if st in (cp_model.OPTIMAL, cp_model.FEASIBLE) and s.objective_value < (value if value is not None else math.inf):
        hint, value = list(s.response_proto.solution), s.objective_value
    search.lap("polish")
    return hint, value


def repair_stage(search: Search, sol: Solution, hint: list[int], lb: float | None, reports: list[TierReport]) -> tuple[Solution, list[int]]:
    """Where the answer's counts on an offer summed per dimension do not pack (`new_instances`: the
    plan's packer, with the instances it would buy), the model again with slots for those offers (as
    many as that packing took, for the items the answer put there) and that packing on them, every
    other placement held (`repack`), on fewer of them where a search near it finds that (`fewer_instances`:
    the count the model proved, which the packer's first fit may miss), else as packed. The answer is the better of the two by the tiers, then the cost
    with the instances its packing buys, then the fewest bought so: with every instance counted, the
    plan says its real gap and has no repair (its items never move: one round packs them all). Where no answer has
    the packer's instances (a rule refuses them) nor packs on fewer, the items packed past the count go elsewhere at
    the same tiers (`placed_elsewhere`), else the answer is searched again within the count (`within_limits`).
    Then, where an idle class's kept hosts do not hold what the answer put on the class, `idle_repair`."""
    sol, hint = offer_repair(search, sol, hint, lb, reports)
    return idle_repair(search, sol, hint, lb, reports)


def offer_repair(search: Search, sol: Solution, hint: list[int], lb: float | None, reports: list[TierReport]) -> tuple[Solution, list[int]]:
    """`repair_stage` for the new instances of offers."""
    from reconciler.plan.packing import offer_packing  # (the plan's packer: the plan imports the solver only to annotate)

    model = search.model
    handed = offer_packing(search.problem, sol)
    sol, packed = replace(sol, packed=handed), handed.instances  # (make_plan packs this answer the same: it takes it)
    more = {ok: len(insts) for ok, insts in packed.items() if len(insts) > sol.new.get(ok, 0)}
    need = needed(model, sol, packed, more)
    if not need:
        return sol, hint
    units = {ck for ck in list(need) + [model.class_of[k] for k in need if k in model.class_of]}
    held = {key for key, v in model.x.variable_items() if key[1] in units and hint[v.index] > 0}
    added = slots.extend_slots(model, need, held)
    if not added:
        return sol, hint
    packing = packed_answer(search, with_counts(model, hint, more), packed, added)
    # The packer's packing may take more instances than a packing near it: that one, where the model allows it.
    fewer = fewer_instances(search, packing, added, {o.key: hint[model.use[o.key].index] for o in added})
    found = (repack(search, fewer) if fewer is not None else None) or repack(search, packing)
    search.lap("repair")
    old_key = emitted(search, hint, more)
    if found is not None:
        new_hint, value = found
        done = {o.key for o in added}
        new_key = emitted(search, new_hint, {ok: n for ok, n in more.items() if ok not in done})
        if flag("FLEETOPS_SOLVER_DEBUG"):
            print(f"[repair] {len(more)} offers short, {len(done)} with slots: {old_key[1:]} -> {new_key[1:]}", flush=True)
        if better(new_key[0], old_key[0], search.tiers) or (new_key[0] == old_key[0] and new_key[1:] < old_key[1:]):
            sol, hint, old_key = finish(search, new_hint, value, lb, status_of(value, lb), reports), new_hint, new_key
    if found is None:
        moved = placed_elsewhere(search, sol, hint, lb, reports, added, packed)
        if moved is not None:
            return moved
        return within_limits(search, sol, hint, lb, reports, added, packed, handed)
    sol, hint = stay_if_cheaper(search, sol, hint, old_key, lb, reports, [o.key for o in added])
    return replace(sol, packed=handed), hint  # (the parts of its packing that are this answer's too: make_plan takes them)


def placed_elsewhere(search: Search, sol: Solution, hint: list[int], lb: float | None, reports: list[TierReport],
                     added: list, packed: dict[str, tuple]) -> tuple[Solution, list[int]] | None:
    """Where the packer's packing of the `added` offers (now with slots) takes more instances than the answer's count,
    no answer has them (`repack` found none) and none packs on fewer (`fewer_instances`): the answer with each offer's
    count's instances as the packer packed them and the items it packed beyond them placed elsewhere, on any other
    capacity their groups may use (new instances of other offers bought for them), every other placement and every
    job placed held, every tier at least at its floor; the cheapest the model finds in REPAIR_WORK, if every offer's
    new instances then pack as counted (`new_instances`). Else None, and `within_limits` searches again with the
    tiers let go. (trace33: the aws pool at its 32 instances, 24 new p4d.24xlarge counted and 25 needed, their items
    filling 192 of 192 GPUs and 2,297 of 2,304 vCPU; the 2 items packed on a 25th were 2 running low jobs, which the plan
    stopped, so greedy's plan, $82.54/h dearer, ranked higher and was emitted.)"""
    from reconciler.plan.packing import offer_packing

    model, m = search.model, search.m.clone()
    offers = {o.key for o in added}
    units = offers | {model.class_of[k] for k in offers if k in model.class_of}
    vec = hint + [0] * (len(m.proto.variables) - len(hint))
    start = dict(packed_within(model, hint, packed, offers, units))
    moved = {gk for (gk, ck), v in model.x.variable_items() if ck in units and start[v.index] < vec[v.index]}
    if not moved:
        return None
    held = {v.index for v in model.placed.variables()}
    for i, n in start.items():
        if i not in held:
            vec[i] = n
    free = {v.index for (gk, ck), v in model.x.variable_items() if gk in moved and ck not in units}
    free |= {model.use[o.key].index for o in model.offers if o.key not in offers and not isinstance(model.use[o.key], int)}
    free |= {v.index for (ok, _), v in model.on.variable_items() if ok not in offers}  # (a small offer's slots)
    free |= {v.index for (gk, _, ok, _), v in model.z.variable_items() if gk in moved and ok not in offers}
    for v in model.primaries():
        if v.index not in free:
            dom = m.proto.variables[v.index].domain
            dom[0], dom[1] = vec[v.index], vec[v.index]
    search.objective(m, search.cost)
    set_hints(m, [(v.index, vec[v.index]) for v in model.primaries()])
    s = search.solver_for(presolve=True)
    st = search.clock.solve(s, m, REPAIR_WORK)
    search.lap("repair")
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    answer, value = list(s.response_proto.solution), s.objective_value
    out = searched_again(search, sol, answer, value, lb, reports, f"items of {sorted(offers)} past their count placed elsewhere")
    handed = offer_packing(search.problem, out)
    if any(len(insts) > out.new.get(ok, 0) for ok, insts in handed.instances.items()):
        return None
    return replace(out, packed=handed), answer


def within_limits(search: Search, sol: Solution, hint: list[int], lb: float | None, reports: list[TierReport],
                  added: list, packed: dict[str, tuple], handed) -> tuple[Solution, list[int]]:
    """Where the packer's packing of the `added` offers (now with slots) takes more instances than the answer's count
    and no answer has them (a pool at its max_instances, a quota or the budget: `repack` found none) nor packs on
    fewer (`fewer_instances`) nor places the items past the count elsewhere (`placed_elsewhere`), the answer searched again around those slots (`around_idle`'s search, which an idle
    class's shortfall gets too): what the answer put there packs instance by instance within the count, or goes
    elsewhere, or waits, whichever the tiers prefer; from the plan the answer gave (the packer's packing on the
    count's instances, what it left over not placed), so it is at least that plan. Else the answer stands, and
    the plan leaves the leftovers pending. (trace-fixed-5k's drift plan: the fixed pool at 563 of 563, the answer's
    183 items on its 28 new instances took 29 to pack, and the plan, one job unpacked, ranked below greedy's and
    was greedy's.)"""
    model = search.model
    offers = {o.key for o in added}
    units = offers | {model.class_of[k] for k in offers if k in model.class_of}
    groups = {gk for (gk, ck), v in model.x.variable_items() if ck in units and hint[v.index] > 0}
    packed = {**packed, **most_within(model, hint, packed, added)}
    found = around_idle(search, hint, units, groups, packed_within(model, hint, packed, offers, units))
    search.lap("repair")
    if found is None:
        return replace(sol, packed=handed), hint
    new_hint, value = found
    return searched_again(search, sol, new_hint, value, lb, reports, f"offers {sorted(offers)} do not pack within their count"), new_hint


def searched_again(search: Search, sol: Solution, answer: list[int], value: float, lb: float | None,
                   reports: list[TierReport], what: str) -> Solution:
    """The Solution of `answer`, found by `around_idle` below the floors `sol`'s tiers set: its tiers as
    `moved_reports` says, the bound only where every tier is as before (a bound at the tiers the answer before claimed
    is none at lower ones), and `below_floors` where one is not, so the API compares its plan with greedy's. `what`:
    which repair, for the solver's debug output."""
    out = moved_reports(search.tiers, reports, [search.value(answer, t.expr) for t in search.tiers], search.warm)
    same = out == reports
    if flag("FLEETOPS_SOLVER_DEBUG"):
        print(f"[repair] {what}: tiers {[r.value for r in reports]} -> {[r.value for r in out]}, cost {sol.cost_value} -> {value}", flush=True)
    lb = lb if same else None
    return replace(finish(search, answer, value, lb, status_of(value, lb), out), below_floors=not same)


def moved_reports(tiers: list[Tier], reports: list[TierReport], values: list[int], warm: list[int]) -> list[TierReport]:
    """The tier reports of an answer searched again (`values`, tier by tier) after `reports`' answer: each as it was
    up to the first tier that moved; from there on none is proven (a tier's proof held the tiers above it where they
    were) and each has no bound, and one below the warm start's value (`warm`: greedy's answer) says so, BELOW_GREEDY,
    not FEASIBLE, which promises at least greedy's: the answer may give a tier up for one ranked above it."""
    out, moved = [], False
    for i, (t, r, v) in enumerate(zip(tiers, reports, values)):
        moved = moved or v != r.value
        if not moved:
            out.append(r)
            continue
        below = i < len(warm) and improves(warm[i], v, t.sense)
        out.append(TierReport(r.name, r.sense, v, None, "BELOW_GREEDY" if below else "FEASIBLE", r.seconds))
    return out


def most_within(model: Model, answer: list[int], packed: dict[str, tuple], offers: list) -> dict[str, tuple]:
    """For `within_limits`' start: each of the `offers` whose packing took more instances than the answer's count, its
    count's instances holding the most valued of the items packed there (`pack.most_by_pattern`: the class first, then
    the work), the rest after them, in `packed`'s form; only where that keeps more than the packer's first instances
    do. An item's value is that of the group's new jobs `packed_within` leaves out, the lowest class first: the
    group's lowest valued, as many as the offer holds. (A fixed pool of 274 8-GPU nodes, 1,000 jobs at 120-150 GiB a
    GPU: searched again from the packer's first 274 instances, the answer held 83,090 of guaranteed normal work and
    greedy's plan ranked higher; from the count's most, 88,830 and 72 low GPUs, the exact optimum by class.)"""
    from reconciler.pack import most_by_pattern

    out: dict[str, tuple] = {}
    for cap in sorted(offers, key=lambda c: c.key):
        insts = packed.get(cap.key, ())
        count = min(answer[model.use[cap.key].index], model.slots_of.get(cap.key, 0))
        if len(insts) <= count:
            continue
        total: dict[tuple[str, str], int] = {}
        for inst in insts:
            for ck, gk, n in inst:
                total[(gk, ck)] = total.get((gk, ck), 0) + n
        kinds, stake = sorted(total), {}
        for gk in sorted({gk for gk, _ in kinds}):
            values = []
            for dk in model.p.groups[gk]:
                d, v = model.demands[dk], model.placed[dk]
                new = (v if isinstance(v, int) else answer[v.index]) - d.running_jobs
                values += [(d.klass, d.weight)] * max(0, new)
            stake[gk] = sorted(values)  # (the lowest first: those are the ones left out)
        at_stake, taken = [], {}
        for gk, ck in kinds:
            lows = stake[gk][taken.get(gk, 0):taken.get(gk, 0) + total[(gk, ck)]]
            taken[gk] = taken.get(gk, 0) + total[(gk, ck)]
            at_stake.append(sorted(lows + [(-1, 0)] * (total[(gk, ck)] - len(lows)), reverse=True))
        shape = {gk: model.demands[model.p.groups[gk][0]] for gk, _ in kinds}
        if any(len({(d.gpus, d.cpu, d.memory_gib, d.replicas) for d in (model.demands[k] for k in model.p.groups[gk])}) > 1
               for gk in shape):
            continue  # (a group of several shapes: none here, but no pattern then holds for all of its items)
        patterns = most_by_pattern(cap, count, [(shape[gk], vals) for (gk, _), vals in zip(kinds, at_stake)])
        if patterns is None:
            continue
        first = {}
        for inst in insts[:count]:
            for ck, gk, n in inst:
                first[(gk, ck)] = first.get((gk, ck), 0) + n
        kept = [sum(p[i] for p in patterns) for i in range(len(kinds))]
        if _by_class(v for vals, n in zip(at_stake, kept) for v in vals[:n]) <= _by_class(
                v for kind, vals in zip(kinds, at_stake) for v in vals[:first.get(kind, 0)]):
            continue
        rows = [tuple((ck, gk, p[i]) for i, (gk, ck) in enumerate(kinds) if p[i]) for p in patterns]
        rows += [()] * (count - len(rows))
        rows.append(tuple((ck, gk, total[(gk, ck)] - kept[i]) for i, (gk, ck) in enumerate(kinds) if total[(gk, ck)] > kept[i]))
        out[cap.key] = tuple(rows)
    return out


def _by_class(values) -> list[int]:
    """(class, work) values summed by class, the highest class first: compared as the tiers rank them."""
    out = [0] * len(CLASS_NAMES)
    for klass, work in values:
        if klass >= 0:
            out[len(out) - 1 - klass] += work
    return out


def _hint_cells(model: Model, vec: list[int], cells: dict[tuple, int], slotted: set[str], units: set[str]) -> None:
    """Sets in `vec` the hint of each slot cell z of an offer or class in `slotted` from `cells` ((group, capacity,
    offer, slot) -> items; none: 0), and of each x of a capacity in `units` to the sum of its cells: the one way
    `packed_within` and `packed_less_left` turn a packing into z and x."""
    for (gk, ck, ok, i), v in model.z.variable_items():
        if ok in slotted:
            vec[v.index] = cells.get((gk, ck, ok, i), 0)
    for (gk, ck), v in model.x.variable_items():
        if ck in units:
            vec[v.index] = sum(n for (g, c, _, _), n in cells.items() if (g, c) == (gk, ck))


def packed_within(model: Model, answer: list[int], packed: dict[str, tuple], offers: set[str], units: set[str]) -> list[tuple[int, int]]:
    """Hints for the primary variables of the plan `answer` gives where the packer's packing of `offers` (now with
    slots) took more instances than the answer buys: each offer's first instances, as many as the answer buys, as
    packed (the slots), and the items packed beyond them not placed, their jobs pending as the plan leaves them (the
    group's new jobs of the lowest class first). What `within_limits` starts from. `units`: the offers and their zone classes
    (x's capacity keys there). (A job left over in part keeps its other items in the hint, which CP-SAT repairs.)"""
    vec = answer + [0] * (len(model.m.proto.variables) - len(answer))
    cells: dict[tuple, int] = {}
    left: dict[str, int] = {}  # group -> items packed past the count
    for ok in sorted(offers):
        count = min(answer[model.use[ok].index], model.slots_of.get(ok, 0))
        for i, inst in enumerate(packed.get(ok, ())):
            for ck, gk, n in inst:
                if i < count:
                    cells[(gk, ck, ok, i)] = cells.get((gk, ck, ok, i), 0) + n
                else:
                    left[gk] = left.get(gk, 0) + n
        for i in range(model.slots_of.get(ok, 0)):
            vec[model.on[(ok, i)].index] = 1 if i < count else 0
    _hint_cells(model, vec, cells, offers, units)
    for gk, n in left.items():
        # (the least important first, as the packer leaves them: a group is one shape, any class; taken by its last
        # demands first, it dropped a mixed cluster's high jobs beside its normal ones)
        at = {dk: i for i, dk in enumerate(model.p.groups[gk])}
        for dk in sorted(at, key=lambda k: (model.demands[k].klass, model.demands[k].priority, -at[k])):
            v = model.placed[dk]
            if n <= 0 or isinstance(v, int):
                continue
            d = model.demands[dk]
            jobs = min(vec[v.index] - d.running_jobs, -(-n // d.replicas))  # (new jobs: a running one's stop is another rule's)
            if jobs <= 0:
                continue
            vec[v.index] -= jobs
            n -= jobs * d.replicas
    return [(v.index, vec[v.index]) for v in model.primaries()]


def idle_repair(search: Search, sol: Solution, hint: list[int], lb: float | None, reports: list[TierReport]) -> tuple[Solution, list[int]]:
    """Where the items an answer put on an idle class do not pack onto the hosts it keeps there (`extract.unfold_idle`,
    the planner's packing: its leftovers the plan leaves pending), that class gets per-instance rows (its slots, as
    an offer's new instances get in `offer_repair`) and the answer is searched again around them (`around_idle`):
    what it put there packs host by host, or goes elsewhere (where its jobs ran, say), or waits, whichever the tiers
    prefer. No instance can be bought for it (an idle class has only its hosts), so the packer's packing is no
    answer to check, as an offer's is. The answer found is the plan's (the one before does not pack); none found
    (the work ran out), the answer stands and the plan leaves the leftovers pending, as before. (fleet29: two idle
    n2-standard-16 held 4 jobs in sum, 24 of 32 vCPU and 108 of 128 GiB, but a 60-GiB job fills one alone and the
    other three need 20 vCPU of 16; the answer found keeps the host a critical job ran on, and all four run.)"""
    from reconciler.solve.extract import placements, unfold_idle

    model = search.model
    _, _, x, keep = placements(search.problem, model, hint)
    unfolded, short = unfold_idle(model, x, keep)
    if not short:
        return sol, hint
    held = {key for key, v in model.x.variable_items() if key[1] in short and hint[v.index] > 0}
    added = slots.extend_idle_slots(model, {ik: hint[model.use[ik].index] for ik in sorted(short)}, held)
    if not added:
        return sol, hint
    classes = {o.key for o in added}
    found = around_idle(search, hint, classes, {gk for gk, _ in held}, packed_less_left(model, hint, unfolded, short, classes))
    search.lap("repair")
    if found is None:
        return sol, hint
    new_hint, value = found
    return replace(searched_again(search, sol, new_hint, value, lb, reports, f"idle classes {sorted(short)} do not pack"),
                   packed=sol.packed), new_hint


def packed_less_left(model: Model, answer: list[int], unfolded: dict[tuple[str, str], int], left: dict[str, list[str]],
                     classes: set[str]) -> list[tuple[int, int]]:
    """Hints for the primary variables of the answer the plan would have made of `answer`: the planner's packing of
    each idle class in `classes` (`unfolded`, as extract.unfold_idle packs it) on its slots, without what it left over
    (`left`: those items, and their jobs, are not placed). What `around_idle` starts from, so its answer is at least
    that plan's. (Where a job is left over only in part, its other items stay in the hint, which CP-SAT repairs.)"""
    vec = answer + [0] * (len(model.m.proto.variables) - len(answer))
    gone: dict[str, int] = {}
    for ik in classes:
        for dk in left[ik]:
            gone[dk] = gone.get(dk, 0) + 1
    cells: dict[tuple, int] = {}
    for ik in classes:
        at = {h.key: i for i, h in enumerate(model.idle_members[ik])}
        drop = {}
        for dk in left[ik]:
            drop[dk] = drop.get(dk, 0) + 1
        for (dk, hk), n in unfolded.items():
            if hk in at:
                n -= drop.pop(dk, 0) if at[hk] == 0 else 0  # (extract.unfold_idle leaves them on the first kept host)
                k = (model.group_of[dk], ik, ik, at[hk])
                cells[k] = cells.get(k, 0) + n
        for i in range(model.slots_of[ik]):
            vec[model.on[(ik, i)].index] = 1 if i < answer[model.use[ik].index] else 0
    _hint_cells(model, vec, cells, classes, classes)
    for dk, n in gone.items():
        v = model.placed[dk]
        if not isinstance(v, int):
            vec[v.index] -= min(vec[v.index], -(-n // model.demands[dk].replicas))
    return [(v.index, vec[v.index]) for v in model.primaries()]


def around_idle(search: Search, answer: list[int], classes: set[str], groups: set[str],
                start: list[tuple[int, int]]) -> tuple[list[int], float] | None:
    """The best answer by the tiers, then the cost, that differs from `answer` only in the work of `groups` (the groups
    it put on the idle `classes`, now modelled host by host, or on offers given slots: `within_limits`): where their items go among those classes and the
    running hosts (whose rows are exact: an offer's are not, so what is there stays as it is), which of their jobs
    run and stay where they run, and which of those hosts and of the classes' are kept. Every other placement and
    instance is held, the tiers are let go of the floors the answer set them (the answer claimed more than packs)
    and reached again one by one, in REPAIR_WORK deterministic seconds in all (fleet29: 0.0002), from `start` (the
    primaries of the plan the answer gave, completed first), so the answer is at least that plan by the tiers: a goal
    whose search finds nothing in its work is held where that plan has it. Returns (answer, its cost), or None where
    the start does not complete and a search runs out of work first."""
    model, m = search.model, search.m.clone()
    vec = answer + [0] * (len(m.proto.variables) - len(answer))
    let_go(m, search.floors)
    jobs = {dk for gk in groups for dk in model.p.groups[gk]}
    hosts = {h.key for h in model.hosts}
    free = {v.index for (gk, ck), v in model.x.variable_items() if gk in groups and (ck in classes or ck in hosts)}
    free |= {v.index for (dk, _), v in model.stay.variable_items() if dk in jobs}
    free |= {v.index for dk, v in model.placed.variable_items() if dk in jobs}
    ran_on = {h.key for dk in jobs for h, _ in model.stay_of.get(dk, [])}  # (once, not per instance variable)
    free |= {v.index for k, v in model.use.variable_items() if k in classes or k in ran_on}
    free |= {v.index for (ok, _), v in model.on.variable_items() if ok in classes}
    free |= {v.index for (_, _, ok, _), v in model.z.variable_items() if ok in classes}
    for v in model.primaries():
        if v.index not in free:
            dom = m.proto.variables[v.index].domain
            dom[0], dom[1] = vec[v.index], vec[v.index]
    for (dk, hk), v in model.stay.variable_items():  # (consolidate may have fixed the stays: `Search.fix`)
        if dk in jobs:
            dom = m.proto.variables[v.index].domain
            dom[0], dom[1] = 0, sum(n for k, _, n in model.caps[hk].residents if k == dk)
    best, goals, spent = None, [(t.expr, t.sense) for t in search.tiers] + [(search.cost, "min")], 0.0
    set_objective(m, (*(search.completion() or [([], [])])[0], 0), "max")
    set_hints(m, start)
    s = search.solver_for(fix_variables_to_their_hinted_value=True)
    if search.clock.solve(s, m, REPAIR_WORK / 4) in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        best = list(s.response_proto.solution)
    spent += s.response_proto.deterministic_time
    m.clear_hints()
    for k, (expr, sense) in enumerate(goals):
        search.objective(m, expr, sense)
        if best is not None:
            set_full_hints(m, best)
        s = search.solver_for(presolve=True)  # (it drops the held variables: the search is of the few left)
        st = search.clock.solve(s, m, (REPAIR_WORK - spent) / (len(goals) - k))
        spent += s.response_proto.deterministic_time
        m.clear_hints()
        # A goal's answer only where it does better at that goal: one as good there is another answer of the goals
        # before it, whose goals after it are whatever the search left, not the start's. (A fixed pool of 274
        # memory-heavy nodes: the start held 85,820 of guaranteed normal work; the high tier's search, already at
        # its best, gave an answer with 59,010, which the normal tier's share of the work did not bring back.)
        if st in (cp_model.OPTIMAL, cp_model.FEASIBLE) and (best is None or improves(s.objective_value, search.value(best, expr), sense)):
            best = list(s.response_proto.solution)
        elif best is None:
            return None
        add_bound(m, expr, search.flat(expr), search.value(best, expr), sense)  # (where the search found none better, the start's)
    return best, search.value(best, search.cost)


def status_of(value: float, lb: float | None) -> str:
    """OPTIMAL where the cost reaches its bound (milli-dollars: within half a unit), else FEASIBLE."""
    return "OPTIMAL" if lb is not None and value - lb < 0.5 else "FEASIBLE"


def stay_if_cheaper(search: Search, sol: Solution, hint: list[int], key: tuple[list[int], float, int], lb: float | None,
                    reports: list[TierReport], slotted: list[str]) -> tuple[Solution, list[int]]:
    """The answer that moves only what must move (stay_put's), where the emitted answer (`key`: its tiers, its cost
    with the instances its packing buys) costs more than it and it packs as counted: the moves were chosen on counts
    whose packing took more instances, so they would pay for nothing. (An applied fleet of 80 trace-shaped jobs on 11
    p4d: the answer gave 3 hosts up for 2 new ones, whose packing took a third; the plan moved 5 jobs and said
    "consolidation: a cheaper packing" at $1.41/h more than staying put.) `slotted`: the offers the repair stage
    gave slots, which that answer (found before them) must not buy: its slot variables are 0."""
    from reconciler.plan.packing import new_instances

    model = search.model
    stay = search.stay_answer
    if stay is None or search.stay_value is None or key[1] <= search.stay_value + 0.5:
        return sol, hint
    if any(stay[model.use[ok].index] for ok in slotted):
        return sol, hint
    stay = stay + [0] * (len(search.m.proto.variables) - len(stay))
    if [evaluate(stay, t.expr) for t in search.tiers] != key[0]:
        return sol, hint  # (stay_put holds every tier: never so, but the tiers come first)
    stay_sol = replace(finish(search, stay, search.stay_value, lb, status_of(search.stay_value, lb), reports), consolidated=False)
    if any(len(insts) > stay_sol.new.get(ok, 0) for ok, insts in new_instances(search.problem, stay_sol).items()):
        return sol, hint  # (its own packing would buy more: not the answer it was costed as)
    return stay_sol, stay


def with_counts(model: Model, hint: list[int], more: dict[str, int]) -> list[int]:
    """The answer with the instances its packing took (`more`: offer -> instances)."""
    out = list(hint)
    for ok, n in more.items():
        out[model.use[ok].index] = n
    return out


def emitted(search: Search, hint: list[int], more: dict[str, int]) -> tuple[list[int], float, int]:
    """What the plan of an answer reaches, in the solver's order: its tiers, its cost with the
    instances its packing adds (`more`), and how many those are."""
    cost = search.value(with_counts(search.model, hint, more), search.cost)
    added = sum(n - hint[search.model.use[ok].index] for ok, n in more.items())
    return [search.value(hint, t.expr) for t in search.tiers], cost, added


def needed(model: Model, sol: Solution, packed: dict[str, tuple], more: dict[str, int]) -> dict[str, int]:
    """Per offer to model instance by instance, its slots: each offer not so yet whose packing took more
    instances than its count, with every zone of its class (a class's items land in any), as many
    as the packing took."""
    need: dict[str, int] = {}
    for ok in more:
        if ok in model.slots_of:
            continue  # (exact already: a slot's GPU blocks, which the model does not see)
        ck = model.class_of.get(ok)
        for k in (model.classes[ck].members if ck else [ok]):
            need[k] = max(len(packed.get(k, ())), sol.new.get(k, 0))
    return need


def packed_answer(search: Search, repaired: list[int], packed: dict[str, tuple], added: list) -> list[int]:
    """The answer with the instances its packing took (`repaired`) and that packing on the slots of the `added` offers."""
    m, model = search.m, search.model
    vec = repaired + [0] * (len(m.proto.variables) - len(repaired))
    for o in added:
        insts = packed.get(o.key, ())
        for i in range(min(len(insts), model.slots_of[o.key])):
            vec[model.on[(o.key, i)].index] = 1
            for ck, gk, n in insts[i]:
                v = model.z.get((gk, ck, o.key, i))
                if v is not None:
                    vec[v.index] = n
    return vec


def repack(search: Search, vec: list[int]) -> tuple[list[int], float] | None:
    """A packed answer (`packed_answer`, or `fewer_instances`') as an answer of the model, if the fleet's rules allow
    it (pools, quotas, budget, spot share): (answer, cost), else None. (A search of every slot of those offers for a
    packing on fewer instances, every other placement held, with presolve: at 2k jobs with rules the packer's 11
    instances over the counts became 10 in 0.1 work-seconds, 6 in 0.3; at 1k, 5k and 10k jobs none fewer, at 0.3 to
    0.7 s of CPU at 10k: left out; `fewer_instances` searches the slots beyond the count and the roomiest ones only.)"""
    m = search.m
    search.objective(m, search.cost)
    set_full_hints(m, vec)
    s = search.solver_for(fix_variables_to_their_hinted_value=True)
    st = search.clock.solve(s, m, REPAIR_WORK)
    m.clear_hints()
    if st in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return list(s.response_proto.solution), s.objective_value
    return None


def finish(search: Search, hint: list[int], value: float | None, lb: float | None, status: str, reports: list[TierReport]) -> Solution:
    """The Solution of answer `hint`: its gap (against the bound), whether it is optimal, its cost and bound."""
    fixed = constant(search.cost)
    gap = 0.0 if status == "OPTIMAL" else (max(0.0, (value - lb) / value) if lb is not None and value else 1.0)
    if fixed is not None:
        gap = 0.0
    # (a narrowed model's bounds are of the choices it offered: `Model.narrowed`; a model holding running jobs the
    # rules would let go, of the plans that keep them: Problem.held)
    optimal = gap <= 1e-9 and all(r.proven for r in reports) and not search.model.narrowed and not search.problem.held
    sol = extract(search.problem, search.model, hint, reports, "OPTIMAL" if optimal else "FEASIBLE", optimal, gap, search.t0)
    if fixed is not None:
        value = lb = fixed
    sol = replace(sol, work_spent=round(search.clock.used - search.spent0, 3), cost_value=value, stay_value=search.stay_value,
                  consolidated=search.consolidated, room_jobs=search.room_jobs,
                  cost_bound=None if lb is None else (value if status == "OPTIMAL" else min(lb, value)))
    search.lap("extract")
    return sol


def with_bounds(search: Search, sol: Solution, bound_model: cp_model.CpModel, hint: list[int]) -> Solution:
    """The benchmark's yardsticks: the LP relaxation's least instance cost at the tiers reached, and the integer bound."""
    ivs, ics, ioff = flatten(search.model.instance_cost())
    r = search.lp.optimum(ivs, ics, ioff, maximize=False)
    sol = replace(sol, lp_bound=None if r is None else r[0] / MILLI)
    sol = replace(sol, int_bound=integer_bound(bound_model, search.model.instance_cost(), hint, sol.lp_bound, search.budget))
    search.lap("lp bound")
    return sol


def integer_bound(m: cp_model.CpModel, instance_cost, hint: list[int], lp_bound: float | None, budget: float) -> float | None:
    """The benchmark's integer bound (USD/h): the least instance cost with whole instances per
    offer and capacity summed per offer, or per instance where the model has slots (the model, every tier held at what the plan reached),
    as far as CP-SAT proves it in a bounded search; never below the LP bound. A bound, not a
    plan: valid for every plan that reaches those tiers, however it packs."""
    fixed = constant(instance_cost)
    if fixed is not None:
        return fixed / MILLI
    m.minimize(instance_cost)
    set_full_hints(m, hint)
    s = cp_model.CpSolver()
    s.parameters.num_workers = 1
    s.parameters.random_seed = 0
    s.parameters.catch_sigint_signal = False
    s.parameters.max_deterministic_time = max(2.0, budget)
    s.parameters.max_time_in_seconds = 300.0
    st = s.solve(m)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return lp_bound
    proven_value = (s.objective_value if st == cp_model.OPTIMAL else s.best_objective_bound) / MILLI
    return max(proven_value, lp_bound) if lp_bound is not None else proven_value


__all__ = ["EXACT_BELOW", "GAP_LIMIT", "REPAIR_WORK", "WALL_FACTOR", "WALL_SLACK", "WARM_WORK", "WORKERS", "WORK_PER_SECOND", "Search", "WallCap",
           "Work", "better", "greedy_plan", "repair_stage", "solve", "solve_one", "solve_parts", "warm_start"]
