"""Tenants' rules: ceilings, guarantees, budgets, spot shares, the running work its guarantee protects,
and the dimension its fair share is measured in."""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconciler.ledger import borrow_dims, quota_ok
from reconciler.model import DesiredState, quota_guarantee
from reconciler.problem.rules import cannot_stay
from reconciler.problem.types import DIMS, Capacity, Demand, Problem, TenantRules

if TYPE_CHECKING:
    from reconciler.observe import Observed


def tenant_rules(desired: DesiredState, demands: list[Demand], hosts: list[Capacity], fleet_capacity: dict[str, float],
                 since: dict[str, int] | None = None) -> dict[str, TenantRules]:
    """`since`: job -> the serial of the apply that started it (Observed.since): the guarantee holds the longest-running
    first."""
    since = since or {}
    by_tenant: dict[str, list[Demand]] = {}
    for d in demands:
        by_tenant.setdefault(d.tenant, []).append(d)
    host_of = {h.instance_id: h for h in hosts}
    out = {}
    for name, t in desired.tenants.items():
        q = t.spec.quota
        cap = {dim: q.cap(dim) for dim in DIMS if q.cap(dim) is not None}
        guarantee = {dim: quota_guarantee(q, dim) for dim in DIMS if quota_guarantee(q, dim) is not None}
        # Protected: its running jobs, longest-running first, while they stay inside the guarantee (`_fill`).
        # Only jobs running whole in the shape they ask for now: a gang grown by a replica (or a
        # job whose resources changed) needs capacity it does not hold, which is new work. Counted
        # at its new size, it outweighed other tenants' guaranteed work in this sum (a vision gang
        # grown from 2 to 3 x 8 GPUs evicted nlp's critical MIG job and infra's CPU job to fit the
        # fleet budget and max_instances: issue 18).
        # Nor a job that cannot stay where it runs (its instance must go or no longer allows it): counted, it
        # made a job that can stay look borrowed (found by the property tier).
        # Nor a gang running split (over zones, or a same-instance gang over instances): it must move whole.
        whole = [(d, job, iids) for d in by_tenant.get(name, []) for job, iids in d.running
                 if len(iids) == d.replicas * d.bundle and job not in d.reshaped]
        stays = {job for d, job, iids in whole if all(i in host_of for i in iids) and not cannot_stay(d, [host_of[i] for i in iids])}
        used = {dim: 0.0 for dim in DIMS}
        kept = _fill([(d, job) for d, job, _ in whole if job in stays], guarantee, used, since)
        # Then, in what the guarantee has left, the running jobs that must move (their instance must go or no
        # longer allows them, or a gang runs split): not protected (above), but the guarantee's second tier
        # keeps them running before another tenant's new work (objective.guarantees_tiers).
        moving = _fill([(d, job) for d, job, _ in whole if job not in stays], guarantee, used, since)
        size = {job: d.job_size for d, job, _ in whole}
        protected = sum(size[job] for job in kept)
        # Fair share is measured in the dimension its own demand weighs most on, of those it may borrow in: measured in
        # one it borrows nothing of (vCPU its quota leaves unlimited, where it borrows GPUs), greedy counted no share,
        # so its jobs stayed first in line for every borrowed GPU (ledger.borrowed_share).
        demand_dim = {dim: sum(d.req(dim) * d.replicas * len(d.jobs) for d in by_tenant.get(name, [])) / fleet_capacity[dim]
                      if fleet_capacity.get(dim) else 0.0 for dim in DIMS}
        dominant = max(borrow_dims(cap, guarantee) or DIMS, key=lambda k: (demand_dim[k], k == "gpus"))
        out[name] = TenantRules(
            name=name, weight=t.spec.weight, cap=cap, guarantee=guarantee,
            budget=desired.guardrails.tenant_hourly_budgets.get(name),
            spot_fraction=desired.spot_policy.tenant_max_spot_fraction.get(name),
            protected=protected, protected_jobs=tuple(kept), moving_jobs=tuple(moving), dominant=dominant,
        )
    return out


def _fill(running: list[tuple[Demand, str]], guarantee: dict[str, float], used: dict[str, float],
          since: dict[str, int] | None = None) -> list[str]:
    """The running jobs, the longest-running first (`since`: the apply that started each), then the highest priority,
    then the largest, that fit in what `used` leaves of the guarantee (used grows).

    Longest-running first, as the plan that placed them kept them: its tier keeping running jobs inside the guarantee
    comes before its tier of guaranteed work, so a new job of the class went on borrowed capacity beside them. Filled
    again largest first after the apply, t3's new 2-GPU critical job was inside and its running 1-GPU critical j25
    borrowed, and another tenant's pending job reclaimed j25's instance in the plan after the apply (fleet71; through
    the fair share, fleet72). Then largest first, as the plans fill a guarantee with jobs placed together (the tier of
    a class's guaranteed work counts its size): by name, a fleet's 1-GPU normal job took the guarantee's last 4 GPUs
    where the plan that was applied had put a 4-GPU one, the 3 left held no running job, and the next plan filled them
    with the tenant's pending normal job, stopping its low MIG job for the budget (fleet30).

    Under preemption: Never no class takes another's place, so the plan that placed a tenant's new higher-class job
    kept its running lower ones inside the guarantee and put the new one on borrowed room; filled by class after the
    apply, t2's new high 4-GPU job was inside and its running low job borrowed, and t1's guaranteed job took that
    room in the plan after the apply ($11.36/h -> $18.19/h, fleet102). Nor does it under LowerPriority where the new
    job takes no lower one's room: a tenant's higher class stands in for its lower jobs only where it stops them
    (objective.protected_tier), so the plan that placed t2's new critical job beside its running normal one kept the
    normal one inside the guarantee; filled by class after the apply, the normal one was borrowed and t1's critical job
    took its room in the plan after the apply (fleet112)."""
    since = since or {}
    out = []

    def order(dj: tuple[Demand, str]) -> tuple:
        d, job = dj
        started = since.get(job, 0)
        return (started, -d.priority, -d.job_size, job)

    for d, job in sorted(running, key=order):
        need = {dim: d.req(dim) * d.replicas for dim in DIMS}
        if all(quota_ok(used[k], need[k], guarantee[k]) for k in guarantee):
            for k in DIMS:
                used[k] += need[k]
            out.append(job)
    return out


def held_once_applied(problem: Problem, placed: set[str], observed: Observed) -> frozenset[str]:
    """The jobs of `placed` (the jobs a plan runs) that their tenants' guarantees hold once the plan is applied: the
    guarantee filled as the plan after it fills it (`tenant_rules`: `_fill`), a running job at the apply that started
    it (Observed.since: kept or moved, it keeps it), a new one at this apply, after every running one (apply.py).

    What explain says of a placed job is this, of the plan emitted: it read the solver's count of a group's jobs inside
    (Solution.guaranteed), which a part greedy best-fit answered, or greedy's whole plan, does not have, and which
    packing, backfill and the API's choice of plan may have left behind."""
    since, running = observed.since, observed.placements
    now = max(since.values(), default=0) + 1
    out: set[str] = set()
    for name, rules in problem.tenants.items():
        mine = [(d, job) for d in problem.demands if d.tenant == name for job in d.jobs if job in placed]
        if mine:
            after = {job: since.get(job, 0) if running.get(job) else now for _, job in mine}
            out.update(_fill(mine, rules.guarantee, {dim: 0.0 for dim in DIMS}, after))
    return frozenset(out)
