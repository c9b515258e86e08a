"""Tenants' rules: ceilings, guarantees, budgets, spot shares, the running work its guarantee protects,
and the dimension its fair share is measured in."""

from __future__ import annotations

from reconciler.ledger import quota_ok
from reconciler.model import DesiredState, quota_guarantee
from reconciler.problem.rules import gang_split, placement_refusal
from reconciler.problem.types import DIMS, Capacity, Demand, TenantRules


def tenant_rules(desired: DesiredState, demands: list[Demand], hosts: list[Capacity], fleet_capacity: dict[str, float]) -> dict[str, TenantRules]:
    by_tenant: dict[str, list[Demand]] = {}
    for d in demands:
        by_tenant.setdefault(d.tenant, []).append(d)
    host_of = {h.instance_id: h for h in hosts}
    out = {}
    for name, t in desired.tenants.items():
        q = t.spec.quota
        cap = {dim: q.cap(dim) for dim in DIMS if q.cap(dim) is not None}
        guarantee = {dim: quota_guarantee(q, dim) for dim in DIMS if quota_guarantee(q, dim) is not None}
        # Protected: its running jobs, highest priority first, while they stay inside the guarantee.
        used = {dim: 0.0 for dim in DIMS}
        protected = 0
        # Only jobs running whole in the shape they ask for now: a gang grown by a replica (or a
        # job whose resources changed) needs capacity it does not hold, which is new work. Counted
        # at its new size, it outweighed other tenants' guaranteed work in this sum (a vision gang
        # grown from 2 to 3 x 8 GPUs evicted nlp's critical MIG job and infra's CPU job to fit the
        # fleet budget and max_instances: issue 18).
        # Nor a job that cannot stay where it runs (its instance must go or no longer allows it): counted, it
        # made a job that can stay look borrowed (found by the property tier).
        # Nor a gang running split (over zones, or a same-instance gang over instances): it must move whole.
        running = sorted(((d, job) for d in by_tenant.get(name, []) for job, iids in d.running
                          if len(iids) == d.replicas * d.bundle and job not in d.reshaped
                          and all(i in host_of and host_of[i].keep_blocker is None and placement_refusal(d, host_of[i]) is None
                                  for i in iids) and not gang_split(d, [host_of[i] for i in iids])),
                         key=lambda dj: (-dj[0].priority, dj[1]))
        kept: list[str] = []
        for d, job in running:
            need = {dim: d.req(dim) * d.replicas for dim in DIMS}
            if all(quota_ok(used[k], need[k], guarantee[k]) for k in guarantee):
                for k in DIMS:
                    used[k] += need[k]
                protected += d.job_size
                kept.append(job)
        # Fair share is measured in the dimension its own demand weighs most on.
        demand_dim = {dim: sum(d.req(dim) * d.replicas * len(d.jobs) for d in by_tenant.get(name, [])) / fleet_capacity[dim]
                      if fleet_capacity.get(dim) else 0.0 for dim in DIMS}
        dominant = max(DIMS, key=lambda k: (demand_dim[k], k == "gpus"))
        out[name] = TenantRules(
            name=name, weight=t.spec.weight, cap=cap, guarantee=guarantee,
            budget=desired.guardrails.tenant_hourly_budgets.get(name),
            spot_fraction=desired.spot_policy.tenant_max_spot_fraction.get(name),
            protected=protected, protected_jobs=tuple(kept), dominant=dominant,
        )
    return out
