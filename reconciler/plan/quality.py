"""What a finished plan says about itself, and how it ranks: the solver's status and gap as the
emitted plan reaches them (not the solver's counts), jobs left unpacked, the consolidation's
saving, the scheduling rules' figures, and the README's order of outcomes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from reconciler.deadlines import conditions as deadline_conditions
from reconciler.ledger import MILLI
from reconciler.plan.types import Consolidation, CreateAction, DeleteAction, JobChange, Plan
from reconciler.problem import Capacity, Problem
from reconciler.problem.types import GUARANTEES_TIER, RUNNING_GUARANTEES_TIER

if TYPE_CHECKING:  # annotations only: importing the solver pulls ortools and numpy (~0.2 s of CPU; pandas no more: reconciler/cpsat.py)
    from reconciler.observe import Observed
    from reconciler.solve import Solution

UNPACKED = "its replicas could not be packed onto the instances the plan buys"  # then the rule the ledger finds binding


# How a plan says it is greedy best-fit's because that plan ranks higher by the tiers than the solver's packed answer
# (api.plan): more --time-limit is then no promise of a better one (the repair stages' work is fixed), so the plan line
# gives none (render._solver_line).
RANKS_HIGHER = "this plan is greedy best-fit's, which ranks higher by the tiers"
# Why a plan is greedy best-fit's, where what a longer search would do differs (solve.strategy's notes; `greedy_advice`).
GREEDY_ONLY = "greedy best-fit only (--time-limit 0)"
WALL_CAP = "the solver's wall-clock safety cap"
MODEL_INFEASIBLE = ("CP-SAT proved its model infeasible, so no plan keeps every rule as it counts them (pool minimums, "
                    "budgets, quotas and spot rules together) and greedy's answer breaks one: greedy best-fit")


def greedy_advice(note: str) -> str | None:
    """What a plan of greedy best-fit's says would give a better one, by why it is greedy's (its note), or None where
    nothing would: more work is no promise where greedy's plan ranks higher than CP-SAT's packed one, and none where
    the model was proven infeasible (no work limit was hit). `--time-limit 0` asked for greedy's plan alone; CP-SAT's
    plan is then another run's, never ranked below it, not always better (the quickstart: both $53.40/h). The wall-clock
    cap grows with --time-limit as the work does: a less loaded machine, not more work, gets CP-SAT's plan."""
    if note.endswith(RANKS_HIGHER):
        return None
    if note.startswith(GREEDY_ONLY):
        return "a --time-limit above 0 has CP-SAT search for a better one and prove how good it is"
    if WALL_CAP in note:
        return "a run on a less loaded machine gets CP-SAT's"
    if MODEL_INFEASIBLE in note and "work limit" not in note.replace(MODEL_INFEASIBLE, ""):
        return "no longer --time-limit changes that"
    return "a longer --time-limit may find a better one"

def emitted_quality(solution: Solution, hosts: dict[str, Capacity], creates: list[CreateAction], repairs: int,
                    n_unpacked: int, kept: frozenset[str], backfilled: int = 0) -> tuple[str, bool, float]:
    """(status, optimal, gap) of the plan as emitted, not of the solver's counts. The solver's
    cost bound holds for any plan reaching its tiers (its model relaxes packing: capacity summed
    per offer, valid cuts), so the gap is the emitted cost's to that bound: instances the packer
    added (repairs) or left out are counted at their price, like the solver's own objective.
    Optimal only when nothing was repaired or left unpacked; a plan whose packing left jobs
    the solver placed has not reached the tiers the bound is for: no gap (1.0). Nor has one that placed more
    than the solver (backfill): its bound was for the tiers the solver reached, which were not the best. Nor one with
    independent parts greedy best-fit answered (Solution.greedy_parts): they have no bound."""
    if solution.status == "GREEDY_FALLBACK":
        return solution.status, False, solution.gap
    if n_unpacked or backfilled or solution.greedy_parts:
        return "FEASIBLE", False, 1.0
    if solution.cost_value is None or solution.cost_bound is None:
        return solution.status, solution.optimal and not repairs, solution.gap if not repairs else max(solution.gap, 1e-6)
    value = emitted_cost(solution, hosts, creates, kept)
    gap = max(0.0, (value - solution.cost_bound) / value) if value > 0 else 0.0
    optimal = solution.optimal and not repairs and gap <= 1e-9
    return ("OPTIMAL" if optimal else "FEASIBLE"), optimal, (0.0 if optimal else max(gap, 1e-6) if repairs else gap)


def gap_withheld(solver, cost_after: float) -> str | None:
    """Why a plan claims no cost gap, where its plan line claims none (render._solver_line), else None: `solver.gap`
    is then no claim (1.0 stands in for "none" where packing left jobs unpacked or backfill placed more), and
    explain and the plan's line must not differ on it."""
    if solver.optimal:
        return None
    if solver.status == "GREEDY_FALLBACK":
        return "it is greedy best-fit's"
    why = ([f"{solver.greedy_parts} of its independent parts are greedy best-fit's"] if solver.greedy_parts else []) + \
        ([f"packing left {solver.unpacked} job(s) the solver placed pending"] if solver.unpacked else []) + \
        ([f"backfill placed {solver.backfilled} pending job(s) beyond the solver's answer"] if solver.backfilled else []) + \
        ([f"{len(solver.unproven)} tier(s) not proven best"] if solver.unproven else [])
    if why:
        return "; ".join(why)
    if cost_after <= 0:
        return "it costs $0.00/h, the least possible"
    return None


def claimed_gap(solver, cost_after: float) -> float | None:
    """The cost gap the plan's own line claims (0 when optimal or at the least possible cost), None where it claims
    none (gap_withheld: `solver.gap` is then 1.0, a stand-in, or greedy's). What the JSON's `solver.gap` and the
    metrics' gap say: the JSON said 1.0 and metrics 100% beside a plan saying "no optimality gap is claimed"."""
    if solver.optimal or cost_after <= 0:
        return 0.0
    return None if gap_withheld(solver, cost_after) else solver.gap


def proofs_of(solver) -> str:
    """Of which plans a plan's tiers and cost bound are proven, where not of every plan: a model that left choices out
    (solve.model: narrowed) proves them of the choices it offered, a search that held running jobs (api._lawful:
    Problem.held) of the plans that keep them. (A held search's plan said "every tier proven best; cost within 0.00% of a
    lower bound", of every plan, and explain "cost gap 0.0%": fleet117.)"""
    return " and ".join(w for w, on in (("of the choices offered", solver.narrowed),
                                        (f"of the plans that keep the {solver.held} running job(s) its search held", solver.held)) if on)


def emitted_cost(solution: Solution, hosts: dict[str, Capacity], creates: list[CreateAction], kept: frozenset[str]) -> float:
    """The solver's cost objective (milli-dollars an hour) of the plan as emitted: its instances at their
    price (repairs included), the rest of the objective (egress, latency, moves) as the solver counted it."""
    emitted = sum(round(hosts[h].price * MILLI) for h in kept if h in hosts) + sum(round(a.price * MILLI) + 1 for a in creates)
    counted = sum(round(hosts[h].price * MILLI) for h in solution.keep if h in hosts) + \
        sum((round(solution.capacities[k].price * MILLI) + 1) * n for k, n in solution.new.items() if k in solution.capacities)
    return solution.cost_value + emitted - counted


def unpacked(plan: Plan) -> int:
    """Jobs the solver placed that the packer could not (see make_plan)."""
    return sum(1 for j in plan.jobs if j.reason.startswith(UNPACKED))


def guarantee_kept(problem: Problem, plan: Plan, observed: Observed, moving: bool = False) -> int:
    """The README's first tiers as a finished plan shows them: the units of each tenant's protected jobs
    (TenantRules.protected_jobs; with `moving`, also its running jobs that must move, then kept units, not new work) that
    the plan runs, or whose room its own placed work of a higher class takes, unit for unit, by the rule the re-check
    applies (plancheck.stood_in_units; not under preemption: Never, where no class takes another's place). Counted
    wherever that work landed, t1's normal job on a new A100-80GB instance stood in for its low A100 job on an
    instance its pool, over max_instances, gave up: CP-SAT's plan ranked above greedy's, which placed t3's critical
    job there, and claimed its guarantees tier OPTIMAL at 126 units where it kept 119 (fleet136)."""
    from reconciler.plancheck import stood_in_units  # (plancheck imports the plan package)

    placed = {j.job for j in plan.jobs if j.action in ("keep", "place", "move")}
    by_job = {j: d for d in problem.demands for j in d.jobs}
    total = 0
    lost: list[str] = []
    not_new: set[str] = set()
    for rules in problem.tenants.values():
        protected = set(rules.protected_jobs) | (set(rules.moving_jobs) if moving else set())
        not_new |= set(rules.moving_jobs) if moving else set()
        for j in protected:
            d = by_job.get(j)
            if d is None:
                continue
            if j in placed:
                total += d.job_size
            else:
                lost.append(j)
    if lost and problem.placement.preemption != "Never":
        total += sum(stood_in_units(plan, observed, problem, sorted(lost), frozenset(not_new)).values())
    return total


def guarantees_kept_short(problem: Problem, plan: Plan, observed: Observed) -> dict[str, int] | None:
    """What the emitted plan keeps of the guarantees tiers (`guarantee_kept`; with the jobs that must move, the next
    tier), {tier: kept} of those where that is less than its solver's tier of that name claims, else None. The model
    counted a kept job of a class of identical jobs as the class's protected one, so a plan claimed the tier at its
    bound while the job it stopped was the protected one (fleet117); it counts them per host now
    (objective.protected_kept), and this stays as a net. Its first search counts a stand-in wherever it lands
    (Problem.stand_in_rooms), so its claim may be of a looser count than the plan's (fleet136); in the next tier too:
    t1's new normal job on a gcp A100 stood in for its low CPU job that must leave aws-cpu for its data's latency, the
    tier claimed 1 where the plan kept 0, and held so it kept t2's high job off the pool's one instance (fleet137)."""
    short = {}
    for name, moving in ((GUARANTEES_TIER, False), (RUNNING_GUARANTEES_TIER, True)):
        claimed = next((t.get("value") for t in plan.solver.tiers if t.get("name") == name), None)
        if isinstance(claimed, int) and (kept := guarantee_kept(problem, plan, observed, moving=moving)) < claimed:
            short[name] = kept
    return short or None


# A tier's status where the emitted plan keeps less than the solver counted (`as_kept`): no search stopped it there.
KEPT_SHORT = "KEPT_SHORT"


def as_kept(plan: Plan, kept: dict[str, int]) -> Plan:
    """`plan` with its guarantees tiers at `kept` ({tier: units}), what the plan keeps where that is short of the solver's
    count (`guarantees_kept_short`): unproven, status KEPT_SHORT, the plan FEASIBLE. The tier's status with it: a tier left
    HELD below its bound read "how: held" in the PR comment's table, and FEASIBLE "stopped at its work limit" on the
    plan's line (fleet119's answer was optimal in 0.26 s). It is at least greedy's: api.emitted emits greedy's plan
    where that ranks higher (`outcome_rank`, the guarantees first)."""
    tiers = tuple({**t, "value": kept[t["name"]], "status": KEPT_SHORT, "proven": False} if t.get("name") in kept else t
                  for t in plan.solver.tiers)
    return replace(plan, solver=replace(plan.solver, status="FEASIBLE", optimal=False, tiers=tiers))


def outcome_rank(problem: Problem, plan: Plan, observed: Observed) -> tuple[int, ...]:
    """The README's order as a finished plan shows it, higher is better: the guarantees kept (`guarantee_kept`,
    then with the running jobs that must move), then per priority class from the highest, the running work kept
    (in place or moved, by size; every class's first under preemption: Never), then its deadline work (the
    solver's deadline tier: rank x size; without it, greedy's plan of a 1-GPU priority-50 job ranked above CP-SAT's
    of a 4-GPU normal one with the same deadline, which the tiers rank first), then all work placed (priority x
    size); then fewer evicted jobs. The solver's
    tiers hold for its counts; packing can only drop jobs from them (`unpacked`), which this order sees. (Without
    the guarantees, a plan whose packing dropped a protected critical job the solver had moved, to keep an
    unprotected one of that class, ranked above greedy's, which kept the protected one; it was emitted and
    `apply --plan` refused it, and every plan after it: an audit's 500-job fleet, tests/test_open_findings.py.)"""
    running = {j for d in problem.demands for j, _ in d.running}
    placed = {j.job for j in plan.jobs if j.action in ("keep", "place", "move")}
    classes = sorted({d.klass for d in problem.demands}, reverse=True)
    out: list[int] = [guarantee_kept(problem, plan, observed), guarantee_kept(problem, plan, observed, moving=True)]
    run, work = [], []
    for c in classes:
        ds = [d for d in problem.demands if d.klass == c]
        run.append(sum(d.job_size for d in ds for j in d.jobs if j in placed and j in running))
        work.append((sum(d.deadline_rank * d.job_size for d in ds for j in d.jobs if j in placed),
                     sum(d.weight for d in ds for j in d.jobs if j in placed)))
    if problem.placement.preemption == "Never":  # (objective.tiers: every class's running work first)
        out += run + [v for pair in work for v in pair]
    else:
        out += [v for r, (dl, w) in zip(run, work) for v in (r, dl, w)]
    out.append(-sum(1 for j in running if j not in placed))
    return tuple(out)


def rule_summary(problem: Problem, ledger) -> dict:
    """What the plan's scheduling rules come to, from its ledger: licenses held per License,
    reservations' use and waste, deadline conditions."""
    out: dict = {}
    if problem.licenses:
        out["licenses"] = ledger.license_summary()
    if problem.reservations:
        out["reservations"] = ledger.reservation_summary()
    if problem.deadlines:
        out["deadlines"] = deadline_conditions(problem.deadlines, ledger.placed_jobs(), problem.now)
    if problem.quotas:
        out["cloud_quotas"] = ledger.quota_book().summary()
    if problem.quota_floors:
        out["cloud_quota_floors"] = dict(sorted(problem.quota_floors.items()))
    return out


def consolidation(problem: Problem, solution: Solution, kept: frozenset[str], jobs: list[JobChange], deletes: list[DeleteAction],
                  creates: list[CreateAction], hosts: dict[str, Capacity]) -> Consolidation | None:
    """The moves made for a cheaper plan: how many, the instances they free, their one-time cost, and what they
    save an hour against the best answer the solver found that moves only what must move (Solution.stay_value):
    instances, egress and latency together. A difference of instance prices alone is not what they save: on an
    applied 1k-job fleet 69 moves freed 17 instances, the new ones they went to cost $80.60/h more, and moving them
    next to their data saved $229/h of egress and latency. None (not measured) where the solver did not compare."""
    moved = [j for j in jobs if j.action == "move" and j.reason.startswith("consolidation")]
    if not moved:
        return None
    removed = tuple(d.instance_id for d in deletes if d.reason.startswith("consolidated"))
    pol = problem.placement
    demand_of = {job: d for d in problem.demands for job in d.jobs}
    cost = 0.0
    replicas = 0
    for j in moved:
        d = demand_of[j.job]
        n = sum(1 for a, b in zip(j.previous, j.instances) if a != b) or len(j.instances)
        replicas += n
        per = pol.move_cost_per_gpu * (d.gpus // d.bundle) if d.gpus else pol.move_cost_per_replica
        cost += per * n
    saving = None
    if solution.stay_value is not None and solution.cost_value is not None:
        # The plan's objective carries its moves' cost spread over payback_hours; the saving is before it.
        net = solution.stay_value - emitted_cost(solution, hosts, creates, kept)
        saving = round(net / MILLI + cost / pol.payback_hours, 4)
    return Consolidation(replicas, removed, saving, round(cost, 2), solution.room_jobs)


