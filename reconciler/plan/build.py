"""Build a plan from the solver's answer: one function per phase, in order.

1 assign.py: which jobs run, which of their items stay where they are; 2 packing.py: the items
onto GPUs of kept and new instances (2a tenant_spot.py: a tenant's spot share on what packed;
2b stability.py: no move without a rule behind it); 3 instances.py: the creates, named, and the
deletes (3a backfill.py: pending work into the room left); 4 jobs.py: per job, what happens and why;
then quality.py: what the plan reaches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import json
from dataclasses import replace

from reconciler.ledger import plan_ledger, spot_ballast
from reconciler.model import DesiredState
from reconciler.observe import Observed
from reconciler.plan.assign import assign_items
from reconciler.plan.backfill import backfill
from reconciler.plan.file import plan_id
from reconciler.plan.instances import delete_actions, name_instances
from reconciler.plan.jobs import job_changes, spot_share_moves, with_pending_reasons
from reconciler.plan.packing import capacities_of, pack
from reconciler.plan.quality import consolidation, emitted_quality, rule_summary
from reconciler.plan.stability import keep_identical, keep_protected_twins, protected_take_twin_stays, return_home
from reconciler.plan.tenant_spot import settle_tenant_spot
from reconciler.plan.types import JobChange, Plan, RemovedJob, RestartedJob, SolverReport
from reconciler.problem import Problem

if TYPE_CHECKING:  # annotations only: importing the solver pulls ortools and numpy (~0.2 s of CPU; pandas no more: reconciler/cpsat.py)
    from reconciler.solve import Solution


def make_plan(desired: DesiredState, observed: Observed, problem: Problem, solution: Solution) -> Plan:
    # 0. Of twin hosts, the one a guaranteed job runs on is kept (the solver counts identical jobs alike).
    solution = keep_protected_twins(problem, solution)
    # And of a class where an unprotected job stays and a protected one stops, the protected one moves into its room.
    solution = protected_take_twin_stays(problem, solution)
    # The id covers what the plan does, so two different plans never share idempotency keys.
    pid = plan_id(desired, observed, json.dumps(sorted(solution.new.items())) + json.dumps(sorted(solution.keep)))
    caps = capacities_of(problem, solution)
    hosts = {c.key: c for c in problem.hosts()}
    demand_of = {job: d for d in problem.demands for job in d.jobs}

    # 1. Which jobs run, and which of their items stay where they are.
    assigned = assign_items(problem, observed, solution, caps)

    # 2. Pack: hosts keep their residents' GPUs; new instances are filled first-fit decreasing.
    packing = pack(desired.fleet, problem, observed, solution, caps, hosts, demand_of, assigned)

    # 2a. A tenant's spot share on what was packed: on-demand work the packer could not hold
    # leaves the tenant's spot work over its share, so spot work goes too (fleet12, issue 18).
    spot_drops = settle_tenant_spot(problem, observed, assigned.slots, packing, hosts, demand_of)

    # 2b. Never a move to an identical instance: a new instance whose items all fit on an instance
    # the plan deletes, of the same pool, zone, type, market and price, is that instance instead.
    solved = solution  # the solver's answer as it counted it (emitted_quality compares the plan with it)
    if packing.released:  # (spot hosts 2a emptied, moving protected work onto on-demand room)
        solution = replace(solution, keep=frozenset(solution.keep) - packing.released)
    solution = keep_identical(problem, observed, solution, packing.bins_of, hosts, demand_of)
    return_home(problem, observed, solution, packing.bins_of, hosts, demand_of)

    # 3. Name the new instances.
    creates = name_instances(pid, problem, packing, caps)

    # 3a. Backfill: pending work into the room the packing left, on the instances the plan keeps and creates.
    backfilled = backfill(problem, observed, solution, packing, creates, assigned.slots, spot_drops, hosts, demand_of, pid)

    # 4. Per job: what happens to it. Pending reasons are read off the finished plan.
    jobs = job_changes(desired, observed, problem, solution, assigned.slots, packing, spot_drops, hosts)
    ledger = plan_ledger(problem, creates, solution.keep, [(j.job, j.instances) for j in jobs if j.instances])
    jobs = with_pending_reasons(jobs, problem, ledger, packing.unpacked, demand_of, greedy=solution.status == "GREEDY_FALLBACK")
    jobs = spot_share_moves(jobs, problem, ledger, hosts, solution.keep)

    deletes = delete_actions(problem, solution, jobs)
    existing = problem.hosts()
    cost_before = round(sum(c.price for c in existing), 4)
    cost_after = round(sum(c.price for c in existing if c.instance_id in solution.keep) + sum(a.price for a in creates), 4)
    n_unpacked = len({j.job for j in jobs if j.job in packing.unpacked or j.job in spot_drops})  # placed by the solver, not by the plan
    status, optimal, gap = emitted_quality(solved, hosts, creates, packing.repairs, n_unpacked, kept=solution.keep,
                                           backfilled=len(backfilled))
    return Plan(
        id=pid, fleet=desired.fleet, desired_digest=desired.digest, observed_digest=observed.digest,
        creates=tuple(creates), deletes=tuple(deletes), jobs=tuple(jobs), cost_before=cost_before, cost_after=cost_after,
        solver=SolverReport(
            status, optimal, round(gap, 6), round(solution.seconds, 3),
            tiers=tuple({"name": t.name, "value": t.value, "bound": t.bound if t.bound is None else round(t.bound, 3), "status": t.status,
                         "proven": t.proven} for t in solution.tiers),
            scope=solution.scope, repairs=packing.repairs, note=solution.note, work=solution.work_spent, unpacked=n_unpacked,
            backfilled=len(backfilled), narrowed=solution.narrowed, greedy_parts=solution.greedy_parts,
        ),
        kept={c.instance_id: c.price for c in existing if c.instance_id in solution.keep},
        consolidation=consolidation(problem, solved, solution.keep, jobs, deletes, creates, hosts), notes=tuple(getattr(observed, "notes", ())),
        ballast=spot_ballast(ledger), rules=rule_summary(problem, ledger), removed=removed_jobs(desired, observed),
        restarted=restarted_jobs(desired, observed, jobs),
    )


def removed_jobs(desired: DesiredState, observed: Observed) -> tuple[RemovedJob, ...]:
    """The jobs the fleet runs that the config no longer has: they stop (plancheck recomputes them for a saved plan)."""
    return tuple(RemovedJob(job, ids) for job, ids in sorted(observed.removed.items()) if job not in desired.jobs)


def restarted_jobs(desired: DesiredState, observed: Observed, jobs: Iterable[JobChange]) -> tuple[RestartedJob, ...]:
    """The jobs that keep their place whose run spec apply last published differs from the one it would publish now:
    their agents restart them in place, start them (`run` added to a job placed without one) or stop them (`run`
    taken out) (plancheck recomputes them for a saved plan). A job that moves restarts through its move; one that
    stops or finished is not published again. Without the runtime's view (nothing read what apply published) none."""
    from reconciler.runtime.assign import hash_to_publish

    runtime = getattr(observed, "runtime", None)
    if runtime is None:
        return ()
    published = getattr(runtime, "published", None) or {}
    out = []
    for j in jobs:
        job, was = desired.jobs.get(j.job), published.get(j.job)
        if j.action != "keep" or not j.instances or job is None:
            continue
        if job.spec.run is None:
            change = "stops" if was is not None else None
        else:
            change = "starts" if was is None else ("restarts" if hash_to_publish(job, was) != was else None)
        if change is not None:
            out.append(RestartedJob(j.job, tuple(j.instances), change))
    return tuple(out)
