"""The library API the CLI and the tests call: validate, plan, apply, status.

Each function runs the pipeline load -> observe -> solve -> plan [-> apply -> status]
and returns plain objects; none of them prints."""

from __future__ import annotations

import functools
import gc
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from providers.base import TAG_FLEET_UID
from reconciler.errors import ApplyError, ConfigError, GuardrailError, ReconcileError, SolverError, StalePlanError
from reconciler.load import load as _load_config
from providers.catalog import catalog_for, pin_catalog
from reconciler.model import DesiredState
from reconciler.observe import Fleet, Observed
from reconciler.placements import next_serial
from reconciler.backend import backend_for, record_start
from reconciler.runtime.publish import (agent_bus, block_unhealthy, demanding, publish_assignments, published,
                                        removed_checkpoints, with_runtime)
from reconciler import identity
from reconciler.state import State, refuse_links, state_dir, utcnow

if TYPE_CHECKING:
    from reconciler import memo
    from reconciler.apply import ApplyReport, OnEvent
    from reconciler.plan import Plan
    from reconciler.problem import Problem
    from reconciler.solve import Solution

DEFAULT_TIME_LIMIT = 20.0
# The solver (ortools, which imports numpy, and pandas but for reconciler/cpsat.py: ~0.2 s of CPU) is imported where a plan is solved, not
# here: a plan read back from the memo (reconciler/memo.py), `status` and `validate` never load it. gap=None is
# solve.GAP_LIMIT. Likewise the planner, apply, the guardrails and status/ (with rich, ~0.04 s of CPU): a plan
# read back from the memo needs none of them.


@dataclass(frozen=True)
class PlanResult:
    plan: Plan
    desired: DesiredState
    observed: Observed
    problem: Problem
    solution: Solution


@dataclass(frozen=True)
class ApplyResult:
    plan: Plan
    report: ApplyReport
    status_dir: Path
    view: object = None  # the FleetView the apply left (what status/metrics.prom exports)



def load(config_dir: str | Path, cache: bool = False) -> DesiredState:
    """The config, validated against the price catalog it pins (`catalog.json` beside its YAML) or the shipped one."""
    refuse_links(Path(config_dir))  # (before the parse cache, the memo or anything else reads or writes .reconcile/)
    pin_catalog(catalog_for(Path(config_dir)))
    return _load_config(config_dir, cache=cache)


def few_collections(fn):
    """Run fn with the cyclic collector triggered 1/300 as often (as mypy does for a build).
    A plan allocates millions of long-lived objects (config, problem, model) and almost no
    cycles; at CPython's default thresholds the collector traced that heap over and over:
    1.3-2 s of a 10k-instance plan. Restored afterwards, so a long-lived caller is unaffected."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        before = gc.get_threshold()
        gc.set_threshold(200_000, 30, 30)
        try:
            return fn(*args, **kwargs)
        finally:
            gc.set_threshold(*before)

    return wrapper


@few_collections
def validate(config_dir: str | Path) -> DesiredState:
    return load(config_dir)


def _plan(desired: DesiredState, observed: Observed, provider: str, time_limit: float, allow_destroy: int | None,
          now: datetime | None = None, gap: float | None = None, lp_bound: bool = False) -> PlanResult:
    from reconciler.problem import build_problem

    demand = demanding(desired, observed)  # finished jobs demand no capacity
    problem = block_unhealthy(build_problem(demand, observed, provider, now=now or utcnow()), observed)
    plan, solution = emitted(demand, observed, problem, time_limit, gap, lp_bound)
    plan = guarded(plan, desired, observed, allow_destroy)
    return PlanResult(plan, desired, observed, problem, solution)


def guarded(plan: Plan, desired: DesiredState, observed: Observed, allow_destroy: int | None) -> Plan:
    """The plan with the guardrails it breaks, and a note for each price it takes from a pinned catalog.json below
    the public one (policies.guardrails.price_overrides: what a reviewer of a catalog change must see)."""
    from policies.guardrails import override_notes, price_overrides, violations

    from reconciler.site import Site

    sites = {i.id: Site.of(i) for i in observed.instances}
    notes = tuple(n for n in override_notes(price_overrides(plan, sites), desired.guardrails) if n not in plan.notes)
    return replace(plan, violations=tuple(violations(plan, desired.guardrails, allow_destroy, sites, desired)), notes=plan.notes + notes)


def emitted(demand: DesiredState, observed: Observed, problem: Problem, time_limit: float, gap: float | None = None,
            lp_bound: bool = False) -> tuple[Plan, Solution]:
    """The plan the planner emits for a problem, and its solution: CP-SAT's, never ranked below greedy's where its counts
    did not pack, and never one that stops running work no rule requires stopping (`_lawful`). The property tests
    check this, what a user gets, not the first search's answer."""
    from reconciler.plan import RANKS_HIGHER, make_plan, outcome_rank, unpacked
    from reconciler.plan.quality import as_kept, guarantees_kept_short
    from reconciler.solve import GAP_LIMIT, solve

    gap = GAP_LIMIT if gap is None else gap
    solution = solve(problem, time_limit=time_limit, gap_limit=gap, with_lp_bound=lp_bound)
    plan = make_plan(demand, observed, problem, solution)

    @functools.cache
    def greedy() -> tuple[Solution, Plan]:  # greedy best-fit's answer and plan: made once, for either fallback below
        fallback = solve(problem, time_limit=0)
        return fallback, make_plan(demand, observed, problem, fallback)

    if (unpacked(plan) or solution.below_floors or solution.greedy_parts) and solution.status != "GREEDY_FALLBACK":
        # The solver's counts did not all pack (or an idle class was searched again below the tiers' floors, greedy's
        # value among them; or some independent parts fell back to greedy best-fit, so the answer claims no tiers for
        # the check below to hold to the plan): its plan may now rank below greedy's, which is packed instance by
        # instance. Never emit a plan worse than the fallback.
        fallback, other = greedy()
        if outcome_rank(problem, other, observed) > outcome_rank(problem, plan, observed):
            note = (f"CP-SAT's counts left {unpacked(plan)} job(s) unpacked: {RANKS_HIGHER}" if unpacked(plan) else
                    f"CP-SAT's answer, searched again instance by instance where its instances did not hold it: {RANKS_HIGHER}"
                    if solution.below_floors else f"{solution.note}: {RANKS_HIGHER}")
            solution = replace(fallback, note=note)
            plan = replace(other, solver=replace(other.solver, note=note))

    def again(held: dict[str, int]) -> tuple[Solution, Plan]:  # CP-SAT's search again, stand-ins in their rooms
        again_solution = solve(replace(problem, held=held, stand_in_rooms=True), time_limit=time_limit, gap_limit=gap, with_lp_bound=lp_bound)
        return again_solution, make_plan(demand, observed, problem, again_solution)

    if solution.status != "GREEDY_FALLBACK" and (kept := guarantees_kept_short(problem, plan, observed)) is not None:
        # The model counts any kept job of a class of identical jobs as its protected one (objective.protected_tier);
        # the plan's stop may fall on the protected job itself (fleet117: j0 stopped to delete its host, j2 kept). And
        # its first search counts a stand-in wherever it lands (fleet136: t1's normal job on a new instance for its low
        # jobs on one a pool over its max_instances gave up; fleet137: in the next tier, t1's new normal job on a gcp A100
        # for its low CPU job that must leave aws-cpu and fits nowhere). Searched again with stand-ins in their rooms, its answer
        # stands where its claim is the plan's; else the tier claim is the emitted plan's, unproven, and greedy's plan,
        # kept job by job, is emitted if it ranks higher.
        claimed = {t["name"]: t.get("value") for t in plan.solver.tiers if t.get("name") in kept}
        plan = as_kept(plan, kept)
        if not problem.stand_in_rooms and not problem.held:
            again_solution, again_plan = again({})
            if again_solution.status != "GREEDY_FALLBACK" and guarantees_kept_short(problem, again_plan, observed) is None \
                    and outcome_rank(problem, again_plan, observed) >= outcome_rank(problem, plan, observed):
                counts = "; ".join(f"{name}: {kept[name]} units where its model counted {claimed[name]}" for name in kept)
                note = (f"CP-SAT's first answer kept fewer units of the guarantees than its model counted ({counts}): searched "
                        "again with a tenant's higher work in its lower jobs' place only where it takes their room")
                note = f"{again_solution.note}; {note}" if again_solution.note else note
                solution = replace(again_solution, note=note)
                plan = replace(again_plan, solver=replace(again_plan.solver, note=note))
        fallback, other = greedy()
        if outcome_rank(problem, other, observed) > outcome_rank(problem, plan, observed):
            note = f"CP-SAT's answer kept fewer units of the guarantees than its model counted: {RANKS_HIGHER}"
            solution = replace(fallback, note=note)
            plan = replace(other, solver=replace(other.solver, note=note))

    return _lawful(observed, problem, plan, solution, greedy, again)


# searches again after an answer that stopped running jobs no rule requires stopping, at most, before greedy's plan:
# the first counting stand-ins only in their rooms, the next also holding the jobs the answers before it stopped
HOLD_ROUNDS = 2


def _lawful(observed: Observed, problem: Problem, plan: Plan, solution: Solution, greedy: Callable[[], tuple[Solution, Plan]],
            again: Callable[[dict[str, int]], tuple[Solution, Plan]] | None = None) -> tuple[Plan, Solution]:
    """The plan such that it stops no running job that no rule requires stopping (plancheck's rule, the one apply's
    re-check of a saved plan applies); never a plan that breaks it. Where CP-SAT's search did not prove its guarantees
    tier, its answer could trade a job inside one tenant's guarantee for another tenant's work: the PR showed a plan
    `apply --plan` refused, and `apply` without --plan, which did not re-check, stopped the job. And the model's
    guarantees tier counts a tenant's new higher-class work in its lower jobs' place wherever that work lands, where
    the rule asks that it take their room (plancheck.own_higher_class_room). Counted in their rooms
    (Problem.stand_in_rooms: objective.stand_in_room), the fixed cluster of fleet 41 after a shrink kept 1,862 of its
    1,869 running normal units in 20 s, not 1,869: so the looser count is searched first, and its answer stands where
    it breaks no rule (the optimum of a looser model that keeps the rule is the rule's optimum). Else `again` searches
    with the rooms counted; then, up to HOLD_ROUNDS in all, also holding as many running jobs of each stopped job's
    demand as the answer kept and those it stopped (Problem.held: a lazy row; the answer is then FEASIBLE at best, its
    bounds of the plans that keep them). Failing that, greedy best-fit (`greedy()`: its answer and plan) evicts only
    for those rules; if its plan broke one too, that is a bug, and nothing is emitted."""
    from reconciler.plancheck import unlawful_evictions

    wrong = unlawful_evictions(plan, observed, problem)
    if not wrong:
        return plan, solution
    first, last = wrong, plan
    held: dict[str, int] = {}
    demand_of = {j: d for d in problem.demands for j in d.jobs}
    for n in range(HOLD_ROUNDS if again is not None and solution.status != "GREEDY_FALLBACK" else 0):
        if n:
            kept = Counter(demand_of[j.job].key for j in last.jobs if j.action in ("keep", "move") and j.job in demand_of
                           and observed.placements.get(j.job))
            for job in wrong:
                d = demand_of[job]
                held[d.key] = max(held.get(d.key, 0), kept[d.key] + sum(1 for w in wrong if demand_of[w].key == d.key))
        answer, last = again(dict(held))
        if answer.status == "GREEDY_FALLBACK":
            break
        wrong = unlawful_evictions(last, observed, problem)
        if not wrong:
            names = sorted(first)
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            note = (f"CP-SAT's first answer stopped {len(names)} running job(s) no rule requires stopping ({', '.join(names[:3])}{more}): "
                    "searched again with a tenant's higher work in its lower jobs' place only where it takes their room"
                    + (", holding the jobs stopped" if held else ""))
            note = f"{answer.note}; {note}" if answer.note else note
            return replace(last, solver=replace(last.solver, note=note, held=sum(held.values()))), replace(answer, note=note)
    # Greedy's own plan, whatever the answer's status: one whose parts each fell back is greedy best-fit's part by
    # part, which need not be greedy's plan of the whole.
    fallback, other = greedy()
    greedys = unlawful_evictions(other, observed, problem)
    if not greedys:
        note = (f"CP-SAT's answer stopped {len(first)} running job(s) no rule requires stopping, "
                f"{min(first)} first: greedy best-fit")
        return replace(other, solver=replace(other.solver, note=note)), replace(fallback, note=note)
    raise SolverError("internal error: the plan would stop running work that no rule requires stopping; refusing to "
                      "emit it (please report it with the config):\n" + "\n".join(f"  - {w}" for w in first.values())
                      + ("" if greedys == first else "\ngreedy best-fit's plan would stop:\n" + "\n".join(f"  - {w}" for w in greedys.values())))


def _observe(config_dir: Path, desired: DesiredState, fleet: Fleet, current: State, adopt: bool, backend) -> Observed:
    """Observe as the fleet the config, the state and status/ agree this is (reconciler/identity.py), or raise.
    Sets the state's identity (a new uid on a first apply), which an apply saves."""
    known = identity.recorded(config_dir, current)
    uid = identity.check_name(desired.fleet, known.name, known.uid, adopt)
    observed = fleet.observe(current, uid)
    own = sum(1 for i in observed.instances if uid and i.tags.get(TAG_FLEET_UID) == uid)
    here = backend.location
    where = getattr(backend, "describe_location", lambda: here)()
    confirmed = identity.check_confirmed(desired.fleet, known, here, where, own, adopt,
                                         Path(config_dir) / "status" / "fleet.yaml") if uid else uid
    if confirmed != uid:  # status/fleet.yaml's uid, recorded with a state kept elsewhere, and no instance carries it
        uid, observed = confirmed, fleet.observe(current, confirmed)
        observed = replace(observed, notes=observed.notes + (
            f"status/fleet.yaml names uid {known.uid}, recorded with the fleet's state "
            f"{f'at {known.state_at}' if known.state_at else 'somewhere it does not say'}; this run's state ({where}) records "
            "no fleet and no instance carries that uid, so this config is taken as a fleet of its own, with a new uid "
            "(apply writes it into status/fleet.yaml)",))
        own = 0
    adopted = identity.check_foreign(desired.fleet, uid, observed.foreign, adopt, own)
    if adopted is not None:
        uid = adopted
        observed = fleet.observe(current, uid)
    current.fleet_name, current.fleet_uid = desired.fleet, uid or identity.new_uid()
    return observed


@few_collections
def plan(config_dir: str | Path, *, provider: str = "sim", time_limit: float = DEFAULT_TIME_LIMIT,
         allow_destroy: int | None = None, options: dict | None = None, state: str | None = None,
         now: datetime | None = None, gap: float | None = None, lp_bound: bool = False, adopt_fleet: bool = False) -> PlanResult:
    """`state`: the state backend URL (None/'local' or s3://bucket/prefix). `now`: the time
    priority aging is measured at (default: the clock). `lp_bound`: also compute the LP
    relaxation's least instance cost (solution.lp_bound; the benchmark's yardstick). `adopt_fleet`:
    take this config's name and the instances of that name as this fleet's (reconciler/identity.py)."""
    config_dir = Path(config_dir)
    desired = load(config_dir, cache=True)
    backend = backend_for(config_dir, state)
    fleet = Fleet(desired, state_dir(config_dir), provider, options)
    observed = with_runtime(backend, desired, _observe(config_dir, desired, fleet, backend.load(), adopt_fleet, backend))
    return _plan(desired, observed, provider, time_limit, allow_destroy, now, gap, lp_bound)


@dataclass(frozen=True)
class MemoPlan:
    """`reconcile plan`'s answer: the plan, and whether it was read back from the plan memo (reconciler/memo.py)."""

    made: "Plan | memo.Hit"  # the plan made now, or the memo's (parsed when .plan is first read)
    reused: bool
    seconds: float  # what making it took (when reused: when it was first made)
    key: str | None = None  # its memo key (None: an input could not be keyed, or the plan made was not kept)

    @property
    def plan(self) -> Plan:
        return self.made.plan if self.reused else self.made  # type: ignore[union-attr,return-value]

    @property
    def has_changes(self) -> bool:
        return self.made.has_changes


@few_collections
def plan_with_memo(config_dir: str | Path, *, provider: str = "sim", time_limit: float = DEFAULT_TIME_LIMIT,
                   allow_destroy: int | None = None, options: dict | None = None, state: str | None = None,
                   now: datetime | None = None, gap: float | None = None, adopt_fleet: bool = False) -> MemoPlan:
    """`plan`, but the plan made last for exactly these inputs is read back instead of solved again, and a
    new plan is kept for next time (reconciler/memo.py says what the key holds). Apply never uses this."""
    import time

    from reconciler import memo

    t0 = time.monotonic()
    config_dir = Path(config_dir)
    desired = load(config_dir, cache=True)
    backend = backend_for(config_dir, state)
    fleet = Fleet(desired, state_dir(config_dir), provider, options)
    observed = with_runtime(backend, desired, _observe(config_dir, desired, fleet, backend.load(), adopt_fleet, backend))
    when = now or utcnow()
    try:
        key = memo.memo_key(config_dir, desired, observed, when, {
            "provider": provider, "time_limit": float(time_limit), "gap": None if gap is None else float(gap), "allow_destroy": allow_destroy,
            "adopt_fleet": adopt_fleet, "lp_bound": False})
    except memo.Unkeyable:
        key = None
    if key is not None:
        hit = memo.read(config_dir, key, desired, observed)
        if hit is not None:
            return MemoPlan(hit, True, hit.seconds, key)
    made = _plan(desired, observed, provider, time_limit, allow_destroy, when, gap).plan
    seconds = time.monotonic() - t0
    kept = key is not None and memo.keep(config_dir, key, made, seconds, time_limit)
    return MemoPlan(made, False, seconds, key if kept else None)


def no_such_job(job: str, config_dir: str | Path, jobs) -> ReconcileError:
    """The error for a job name the config does not have (`explain`, `logs`), naming some that it has."""
    names = sorted(jobs)
    return ReconcileError(f"no job {job!r} in {config_dir} (jobs: {', '.join(names[:10])}{' ...' if len(names) > 10 else ''})")


@few_collections
def explain(config_dir: str | Path, job: str, *, provider: str = "sim", time_limit: float = DEFAULT_TIME_LIMIT,
            options: dict | None = None, state: str | None = None, now: datetime | None = None, gap: float | None = None):
    """Why JOB runs where it does or is pending, and (for a pending job) which single change
    to the desired state would place it, each checked by planning again against the same fleet."""
    from reconciler.errors import ReconcileError
    from reconciler.explain import explain_job

    res = plan(config_dir, provider=provider, time_limit=time_limit, options=options, state=state, now=now, gap=gap)
    if job not in res.desired.jobs:
        raise no_such_job(job, config_dir, res.desired.jobs)
    finished = getattr(res.observed.runtime, "finished", {})
    if job in finished:
        raise ReconcileError(f"job {job} {finished[job]} (its run records have this spec): it demands no capacity until its spec "
                             f"changes; see `reconcile status` and `reconcile logs`")
    when = now or utcnow()
    quick = max(1.0, min(time_limit, 5.0))

    def resolve(desired: DesiredState, observed=None) -> Plan:
        """Plan `desired` against the same fleet (or `observed`: the same fleet with an account quota raised)."""
        return _plan(desired, observed if observed is not None else res.observed, provider, quick, None, when, gap).plan

    return explain_job(job, res.desired, res.observed, res.problem, res.plan, resolve)


@few_collections
def apply(config_dir: str | Path, *, saved_plan: Plan | None = None, provider: str = "sim",
          time_limit: float = DEFAULT_TIME_LIMIT, allow_destroy: int | None = None, options: dict | None = None,
          state: str | None = None, gap: float | None = None, on_plan: Callable[[Plan], None] | None = None,
          on_event: OnEvent | None = None, should_stop: Callable[[], bool] | None = None, adopt_fleet: bool = False) -> ApplyResult:
    """Plan (or take a saved plan), check guardrails, apply, write status.

    on_plan: shown the plan that is about to be applied (after the guardrails passed, before any action);
    on_event, should_stop: progress and Ctrl-C, as in apply_plan. Raises StalePlanError or GuardrailError
    before any provider call, AccessDeniedError before any change (check_permissions); raises ApplyError after writing status when some actions failed."""
    from reconciler.apply import apply_plan, check_permissions
    from reconciler.plancheck import recheck
    from reconciler.problem import build_problem
    from reconciler.status import StatusFiles, record_identity, write_status

    config_dir = Path(config_dir)
    desired = load(config_dir, cache=True)
    backend = backend_for(config_dir, state)
    with backend.lock():
        with StatusFiles(config_dir) as status_files:
            status_files.check()  # a status/ that cannot be written safely is refused before anything changes
        current = backend.load()
        fleet = Fleet(desired, state_dir(config_dir), provider, options)
        fleet.agent_state_url = agent_bus(desired, state)  # type: ignore[attr-defined]
        fleet.guard = backend.check_lock  # a lost lock stops the apply before its next provider call
        before = (current.fleet_name, current.fleet_uid)
        observed = with_runtime(backend, desired, _observe(config_dir, desired, fleet, current, adopt_fleet, backend))
        if (current.fleet_name, current.fleet_uid) != before:
            backend.save(current)  # the identity before any launch carries it: a killed apply's instances stay ours
            # ... and status/fleet.yaml with it (if there is one): the next run refuses the two disagreeing (identity.py)
            record_identity(config_dir, current.fleet_name, current.fleet_uid, backend.location)
        if saved_plan is not None:
            if saved_plan.fleet != desired.fleet:
                raise StalePlanError(f"the plan is for fleet {saved_plan.fleet!r}, this config is fleet {desired.fleet!r}")
            if saved_plan.desired_digest != desired.digest:
                raise StalePlanError("stale plan: the desired state changed since the plan was made; run `reconcile plan` again")
            if saved_plan.observed_digest != observed.digest:
                raise StalePlanError("stale plan: the fleet changed since the plan was made (instances or placements); run `reconcile plan` again")
            demand = demanding(desired, observed)  # as `reconcile plan` saw it: finished jobs demand nothing
            problem = block_unhealthy(build_problem(demand, observed, provider, now=utcnow()), observed)
            checked, refused = recheck(saved_plan, demand, observed, problem)
            if refused:
                raise StalePlanError("refusing the saved plan; nothing was changed:\n" + "\n".join(f"  - {r}" for r in refused))
            the_plan = guarded(checked, desired, observed, allow_destroy)
        else:
            planned = _plan(desired, observed, provider, time_limit, allow_destroy, gap=gap)
            the_plan, problem = planned.plan, planned.problem
            # The plan made now passes the re-check a saved plan does, before any provider call: the planner is
            # checked by the same rules, not trusted (its evictions were not, and stopped guaranteed work: _lawful).
            # Only a plan with changes: 2.1 s of CPU on the applied 5k fleet, none where nothing would be done.
            refused = recheck(the_plan, demanding(desired, observed), observed, problem)[1] if the_plan.has_changes else []
            if refused:
                raise SolverError("internal error: the plan made now fails apply's re-check; nothing was changed (please "
                                  "report it with the config):\n" + "\n".join(f"  - {r}" for r in refused))
        if the_plan.violations:
            raise GuardrailError("refusing to apply; nothing was changed:\n" + "\n".join(f"  - {v}" for v in the_plan.violations))
        assigned = published(backend)
        # The serial this apply writes is above every published assignment's too (apply_plan adds one): an agent takes
        # only an assignment whose serial is not below its own, and after a lost state file (recovered from the tags,
        # which an edit of `run` does not rewrite) the next edit was published below it and never taken.
        current.serial = max([current.serial, *(d.get("serial", 0) for d in assigned.values())])
        serial = next_serial(current, observed.serial, observed.instances)  # (refused here if none is left)
        check_permissions(desired, observed, the_plan, fleet, current, serial)  # (refused here: nothing changed yet)
        if on_plan is not None:
            on_plan(the_plan)
        # Before any provider call, the backend records the serial this apply writes its tags with: a crash before the
        # state is saved leaves tags newer than it that observe believes, and no others (reconciler/placements.py).
        backend.check_lock()
        record_start(backend, current, serial)
        report = apply_plan(desired, observed, the_plan, fleet, current, on_event=on_event, should_stop=should_stop, serial=serial)
        backend.check_lock()  # never write the shared state without the lock
        backend.save(current)
        after = fleet.observe(current).instances
        listed = {i.id for i in observed.instances}  # before this apply deleted any: what vanished went without it
        vanished = {i for ids in observed.lost.values() for i in ids} | {i for i in assigned if i not in listed}
        view = publish_assignments(backend, desired, current, list(after), fleet, config_dir, state, assigned, vanished)
        report.notes.extend(removed_checkpoints(backend, desired, assigned))
        status_dir = write_status(config_dir, desired, the_plan, report, list(after), runtime=view,
                                  fleet_uid=current.fleet_uid, state_at=backend.location)
        left = _write_metrics(status_dir, problem or build_problem(demanding(desired, observed), observed, provider, now=utcnow()),
                              desired, observed, the_plan, report, view)
    result = ApplyResult(the_plan, report, status_dir, left)
    if not report.ok:
        done = report.counts
        err = ApplyError(f"apply partly failed ({done}; status written):\n" + "\n".join(f"  - {f}" for f in report.failures))
        err.result = result  # type: ignore[attr-defined]
        raise err
    return result


def remove_checkpoints(config_dir: str | Path, state: str | None = None) -> list[str]:
    """What an apply does last for the jobs removed from the config (publish.removed_checkpoints), on its own: the
    controller's, when its plan changes nothing (the stop of a removed job's replicas is reported after the apply that
    removed it, and then nothing may change the fleet for long). Under the lock; only when such a job has checkpoints."""
    from reconciler.runtime import checkpoints

    desired = load(config_dir, cache=True)
    backend = backend_for(Path(config_dir), state)
    if all(j in desired.jobs for j in checkpoints.jobs(backend)):
        return []
    with backend.lock():
        return removed_checkpoints(backend, desired, published(backend))


def _write_metrics(status_dir: Path, problem: Problem, desired: DesiredState, observed: Observed, the_plan: Plan,
                   report: ApplyReport, runtime=None):
    """status/metrics.prom: the fleet the apply left, for node_exporter's textfile collector (not committed with
    status: its plan time and queue waits change every run). Returns that view (the controller serves it)."""
    from reconciler.fleetview import applied_view
    from reconciler.metrics import exposition
    from reconciler.statusfiles import METRICS_FILE, StatusFiles

    view = applied_view(problem, desired, observed, the_plan, report, utcnow(), runtime)
    # As every status file: never through a link (the repo's status/ is a pull request's to change), checked
    # before the apply by StatusFiles.check.
    with StatusFiles(status_dir.parent) as files:
        files.write(status_dir / METRICS_FILE, exposition(view))
    return view


def fleet_view(res: PlanResult, now: datetime | None = None):
    """The fleet now (observed), with the plan's reasons for what does not run: what `reconcile metrics` exports
    and `reconcile report` draws."""
    from reconciler.fleetview import current_view

    return current_view(res.problem, res.desired, res.observed, res.plan, now or utcnow())


def read_status(config_dir: str | Path, live: bool = False, state: str | None = None) -> dict:
    """The status files as one document: fleet summary, pools, jobs. `live`: job phases as the node
    agents report them now (the files have them as of the last apply)."""
    from reconciler.status import read_status as read_status_files

    out = read_status_files(Path(config_dir))
    if live and out["jobs"]:
        _live_phases(Path(config_dir), out, state)
    return out


def _live_phases(config_dir: Path, out: dict, state: str | None) -> None:
    from reconciler.errors import ReconcileError
    from reconciler.runtime.publish import read_view

    try:
        desired = load(config_dir)
        backend = backend_for(config_dir, state)
        st = backend.load()
        placements = st.placements
        if not st.serial:  # no state (deleted, or lost): where the last apply placed the jobs is what its status files say
            placements = {n: list(ids) for n, d in out["jobs"].items()
                          if isinstance(ids := (d.get("status") or {}).get("instances"), list) and all(isinstance(i, str) for i in ids)}
        view = read_view(backend, desired, placements, None)
    except ReconcileError:
        return  # the files still say what the last apply saw
    if view is None:
        return
    out["agents"] = view.agents_status()
    now = utcnow().isoformat()
    for name, run in view.jobs.items():
        st = (out["jobs"].get(name) or {}).get("status")
        if st is not None and st.get("run") is not None:
            st["phase"] = run.phase
            st["run"].update(reason=run.reason, message=run.message, restarts=run.restarts, startedAt=run.started_at,
                             finishedAt=run.finished_at, replicas=list(run.replicas), lastLog=list(run.log_tail))
            st["conditions"] = _live_conditions(st["conditions"], run.conditions, now, dict(run.since))
    fleet = (out.get("fleet") or {}).get("status")
    if isinstance(fleet, dict):  # the counts agree with the phases shown: a job that finished since the apply is done,
        from reconciler.fleetview import count_phase  # (a reservation, phase Reserved: no `run`, is reserved)
        from reconciler.status import job_counts

        shown = {n: d.get("status") or {} for n, d in out["jobs"].items()}
        fleet["jobs"] = job_counts({n: count_phase(bool(s.get("instances")), view.finished.get(n), s.get("phase") == "Reserved",
                                                   s.get("phase")) for n, s in shown.items()})


def _live_conditions(conditions: list, live: tuple, now: str, since: dict | None = None) -> list:
    """The job's conditions with those the agents' reports decide (Running, Succeeded, Failed, Restarts, ...) as they
    are now, so none contradicts the live phase, each dated as apply dates it (status.dated_condition: a condition that
    flipped since the files were written from the reports' `since`, else now); Placed and the deadline conditions stay
    as the last apply decided them (the placement changes only on an apply)."""
    from reconciler.status import dated_condition

    fresh = {c[0]: c for c in live}
    return [dated_condition(fresh[c.get("type")], c, now, since) if isinstance(c, dict) and c.get("type") in fresh else c
            for c in conditions]


@dataclass(frozen=True)
class JobOutcome:
    job: str
    base: str  # "absent", "running on 2x p4d.24xlarge (aws/us-east-1b)", "reserved on ..." (no `run`), "pending: <reason>"
    head: str


@dataclass(frozen=True)
class DiffResult:
    """What merging a change does to the fleet, against the same observed fleet."""

    base_ref: str
    base: Plan
    head: Plan
    documents: tuple[str, ...]  # "+ Job/x", "- Pool/y", "~ Tenant/z"
    jobs: tuple[JobOutcome, ...]  # only jobs whose outcome differs
    capacity: tuple[tuple[str, int, int], ...]  # (pool type market, base count, head count) where they differ
    # Jobs the fleet does not run yet that both plans start, on other instances in each: no outcome of the change (neither
    # plan is applied; the instances the fleet buys are `capacity`'s), where equal-cost choices fall either way.
    elsewhere: tuple[JobOutcome, ...] = ()

    @property
    def has_changes(self) -> bool:
        return bool(self.documents or self.jobs or self.capacity)


def _outcomes(plan: Plan, placed_types: dict[str, str], desired: DesiredState) -> dict[str, str]:
    """job -> what the plan does with it; a job without `run` is a reservation: "reserved on", nothing runs. A job
    the plan moves (it restarts: resized, its instance going, a consolidation) or whose run it restarts, starts or
    stops says so, in the plan's words: on the same instance type before and after it had read the same, and a pull
    request that restarts a running job listed no outcome for it."""
    from reconciler.render import RUN_CHANGES

    runs = {r.job: RUN_CHANGES[r.change] for r in plan.restarted}
    out = {}
    for j in plan.jobs:
        if j.instances:
            kinds = sorted({placed_types.get(i, i) for i in j.instances})
            job = desired.jobs.get(j.job)
            verb = "reserved" if job is not None and job.spec.run is None else "running"
            out[j.job] = (f"{verb} on {len(j.instances)}x {', '.join(kinds)}"
                          + ("; move (restarts)" if j.action == "move" else "")  # (not its reason: it names this plan's refs)
                          + (f"; {runs[j.job]}" if j.job in runs else ""))
        else:
            out[j.job] = f"pending: {j.reason}"
    return out


def _resulting_fleet(plan: Plan, observed: Observed) -> tuple[dict[str, int], dict[str, str]]:
    counts: dict[str, int] = {}
    types: dict[str, str] = {}
    for i in observed.instances:
        if i.id in plan.kept:
            key = f"{i.pool} {i.instance_type} {i.market}"
            counts[key] = counts.get(key, 0) + 1
            types[i.id] = f"{i.instance_type} ({i.cloud}/{i.zone})"
    for c in plan.creates:
        key = f"{c.site.pool} {c.site.instance_type} {c.site.market}"
        counts[key] = counts.get(key, 0) + 1
        types[c.ref] = f"{c.site.instance_type} ({c.site.cloud}/{c.site.zone})"
    return counts, types


@few_collections
def diff(config_dir: str | Path, base_ref: str, *, provider: str = "sim", time_limit: float = DEFAULT_TIME_LIMIT,
         options: dict | None = None, state: str | None = None, gap: float | None = None) -> DiffResult:
    """Plan the config at `base_ref` and the working config against the same fleet, and
    report only what differs: the change a pull request makes, not the fleet's drift."""
    import tempfile

    from reconciler.gitops import export_config

    config_dir = Path(config_dir)
    head = plan(config_dir, provider=provider, time_limit=time_limit, options=options, state=state, gap=gap)
    with tempfile.TemporaryDirectory() as tmp:
        base_dir = export_config(config_dir, base_ref, Path(tmp) / "base")
        try:
            base_desired = load(base_dir)
        except ConfigError as e:  # (its files' names are the working copy's: say whose they are)
            raise ConfigError([replace(d, file=f"{base_ref}:{d.file}") for d in e.diagnostics]) from None  # (git show REF:PATH)
        backend = backend_for(config_dir, state)
        fleet = Fleet(base_desired, state_dir(config_dir), provider, options)  # the same fleet state as head
        base = _plan(base_desired, with_runtime(backend, base_desired, fleet.observe(backend.load())), provider, time_limit, None, gap=gap)
    docs = []
    bd, hd = base.desired, head.desired
    for kind, b, h in (("Tenant", bd.tenants, hd.tenants), ("Pool", bd.pools, hd.pools), ("Job", bd.jobs, hd.jobs),
                       ("License", bd.licenses, hd.licenses), ("Reservation", bd.reservations, hd.reservations)):
        for name in sorted(set(b) | set(h)):
            if name not in b:
                docs.append(f"+ {kind}/{name}")
            elif name not in h:
                docs.append(f"- {kind}/{name}")
            elif b[name] != h[name]:
                docs.append(f"~ {kind}/{name}")
    for kind, b, h in (("SpotPolicy", bd.spot_policy, hd.spot_policy), ("GuardrailPolicy", bd.guardrails, hd.guardrails),
                       ("PlacementPolicy", bd.placement, hd.placement), ("Topology", bd.topology, hd.topology)):
        if b != h:
            docs.append(f"~ {kind}")
    bcount, btypes = _resulting_fleet(base.plan, base.observed)
    hcount, htypes = _resulting_fleet(head.plan, head.observed)
    bout, hout = _outcomes(base.plan, btypes, base.desired), _outcomes(head.plan, htypes, head.desired)
    differ = [JobOutcome(j, bout.get(j, "absent"), hout.get(j, "absent"))
              for j in sorted(set(bout) | set(hout)) if bout.get(j, "absent") != hout.get(j, "absent")]
    starts = _started(base.plan) & _started(head.plan)
    jobs = tuple(o for o in differ if o.job not in starts or _state(o.base) != _state(o.head))
    elsewhere = tuple(o for o in differ if o not in jobs)
    capacity = tuple((k, bcount.get(k, 0), hcount.get(k, 0)) for k in sorted(set(bcount) | set(hcount)) if bcount.get(k, 0) != hcount.get(k, 0))
    return DiffResult(base_ref, base.plan, head.plan, tuple(docs), jobs, capacity, elsewhere)


def _started(plan: Plan) -> set[str]:
    """The jobs a plan places that the fleet does not run: where it would start them is a choice of that plan, and of
    equal-cost places (zones of one price, instances of a tie) two plans may each take another. A PR adding one job to
    examples/ml-platform, nothing applied, listed 7 job outcomes at the same $/h, 6 of them jobs it did not touch only
    placed elsewhere: 3 in another zone of the same pool, 3 sharing another instance."""
    return {j.job for j in plan.jobs if j.action == "place"}


def _state(outcome: str) -> str:
    """An outcome without where (`_outcomes`): "running", "reserved", "pending: <reason>"."""
    return outcome if outcome.startswith("pending: ") else outcome.split(" on ", 1)[0]
