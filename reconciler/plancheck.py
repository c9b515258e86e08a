"""Check a saved plan's every action on its own before apply carries it out.

A plan file is input: it is made by `reconcile plan --out`, kept as a CI artifact, reviewed,
and may be edited on the way, carelessly or not. Matching digests say only that the desired
and observed state did not change; they say nothing of what the body asks for. So each action
is checked against the current desired state, the offerings and the observed fleet, as if the
planner had proposed it, and everything the plan states about money is recomputed from prices,
never read from the plan:

* a create names a pool that exists, an offer that pool allows now (its cloud, region, zone,
  type and market, inside the guardrails' regions and the spot price cap, not in a capacity
  cool-off), the provider that pool uses, and a key and ref of this plan's form; its price and
  spot bid come from the offering;
* no pool ends with more than max_instances, nor under a min_instances the fleet meets now, nor, under one it does not
  meet (quota-lowered, as the planner reads it), with fewer instances than it keeps there or short of an instance of its
  offers that breaks no rule (what the planner buys; a zone in a capacity cool-off has no offer), and the creates fit the headroom of every cloud account quota
  as apply reads it now (quotas are not in the observed digest: another team's launch or a lowered limit since
  the plan was made is found here), by the one rule in reconciler/ledger.py (apply creates before it deletes,
  so a delete frees nothing for this plan); before, such a plan launched until the cloud refused, half applied;
* a delete names an instance of this fleet that the plan's observed snapshot (the fleet now,
  as the observed digest matched) has; every replica running on it is moved off or evicted by
  the plan, and every job the fleet runs is accounted for;
* jobs land only on instances that stay or that the plan creates, each listed once, with as many
  replicas as it has; an action agrees with what the snapshot runs (keep and move: running; place:
  not; a job that runs stops only as an evict, never hidden as pending);
* what every instance will host fits it (reconciler/problem/types.py's one definition of an instance's
  capacity and a replica's needs): GPUs, vCPUs, memory and MIG slices within the instance, each
  whole-GPU replica on as many distinct GPU indices as it asks, inside the instance, none shared;
  and a replica arriving on an instance obeys every placement rule the planner does (GPU model,
  spot, allowlists, latency; never onto an instance that must go). An instance whose residents
  the plan leaves exactly as they run is not re-judged: the plan changes nothing there;
* a job's replicas that arrive somewhere stay together as its gang mode asks (one zone; one instance; one
  instance type and placement group);
* no tenant ends over a ceiling (quota, or burst) or over its budget where it was not before, and no
  fleet-wide rule the fleet keeps now (spot share, on-demand buffer, spot diversity, a tenant's spot share,
  license counts) is broken by the plan: the plan's fleet and the snapshot's are read by the one ledger
  (reconciler/ledger.py) that the planner reads; a rule the fleet keeps only with instances that must go or jobs
  that changed (ledger.staying_ledger) it does not keep now;
* running work is stopped (evicted) only for a rule that requires it, as the planner stops it: the job
  changed, cannot stay where it runs (its instance must go, or no longer allows or holds it), higher-class
  work of its own tenant arrives, its tenant is over its ceiling, or the fleet as it runs (or as it can stay:
  without the instances that must go and the jobs that changed, ledger.rules_broken_now) breaks a fleet-wide rule
  and the plan with the job kept instead would break a rule the plan keeps (KeptInstead: not merely because some
  rule is broken), or its own tenant's (that tenant's work only, and only what can mend it: for its spot share its
  spot work, for its ceiling its work in a dimension it is over, for its budget any); otherwise only
  borrowed work, never a job inside its tenant's guarantee;
* the budget guardrail is checked on the recomputed cost (policies/guardrails.py, unchanged).

Pure: plain data in, (the plan as it will be applied, the reasons to refuse it) out."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from providers.base import TAG_CREATE_KEY
from reconciler.ledger import (QuotaBook, budget_ok, jobs_that_must_leave, licensed_by, money, plan_ledger, quota_ok, quota_scope, quota_units, rules_broken_now,
                              running_ledger, stand_in_item_units)
from reconciler.model import DesiredState
from reconciler.observe import Observed
from reconciler.plan import CreateAction, DeleteAction, Plan, placement_group_name, removed_jobs, restarted_jobs
from reconciler.plan.file import PLAN_ID_LEN, is_plan_id
from reconciler.problem import DIMS, Capacity, Demand, Host, Problem, borrowing_tenants, borrows, over_cap_tenants, placement_refusal
from reconciler.problem.partition import Partition
from reconciler.problem.rules import running_use
from reconciler.site import Site
from reconciler.words import amount


def recheck(plan: Plan, desired: DesiredState, observed: Observed, problem: Problem) -> tuple[Plan, list[str]]:
    offers = {c.offer_key: c for c in problem.offers()}
    host_price = {c.instance_id: c.price for c in problem.hosts()}
    instances = {i.id: i for i in observed.instances}

    creates, errors = _checked_creates(plan, desired, problem, offers)
    if not is_plan_id(plan.id):  # (a saved plan's is checked when read: this is for a Plan handed to api.apply)
        errors.insert(0, f"plan id {plan.id[:40]!r} is not one `reconcile plan` makes ({PLAN_ID_LEN} hex digits)")
    errors += _key_errors(creates, observed)
    refs = {c.ref for c in creates}
    deletes, more = _checked_deletes(plan, desired, instances, host_price)
    errors += more
    leaving = {d.instance_id for d in deletes} | {d.instance_id for d in plan.deletes}
    staying = set(instances) - leaving
    errors += _pool_errors(desired, instances, staying, creates)
    errors += _quota_errors(problem, creates, offers)
    errors += _job_errors(plan, desired, observed, refs, staying, deletes)
    errors += _fit_errors(plan, observed, problem, {c.ref: offers[c.offer_key] for c in creates},
                          staying)

    errors += _gang_errors(plan, observed, problem, creates)
    ledgers = _ledgers(plan, problem, creates, staying)
    if ledgers is not None:  # (else refused above: a job with the wrong number of replicas)
        after, before = ledgers
        errors += _tenant_errors(problem, after, before)
        broken_now = rules_broken_now(problem) | before.broken_rules()  # (as it runs, and as it can stay)
        errors += _fleet_rule_errors(after, broken_now)
        errors += _pool_min_errors(problem, after, broken_now, creates)
        errors += _eviction_errors(plan, observed, problem, broken_now, lambda: KeptInstead.of(plan, observed, problem, staying, creates))

    cost_before = round(sum(host_price.get(i, 0.0) for i in instances), 4)
    kept = {i: host_price.get(i, 0.0) for i in sorted(staying)}
    cost_after = round(sum(kept.values()) + sum(c.price for c in creates), 4)
    checked = replace(plan, creates=tuple(creates), deletes=tuple(deletes), cost_before=cost_before, cost_after=cost_after,
                      kept=kept, removed=removed_jobs(desired, observed),  # (what stops is what the fleet runs, never the file's word)
                      notes=tuple(getattr(observed, "notes", ())),  # (what observe says now, as plan.build takes them: a forged
                      # "approved by security" was printed as a note of the tool's own)
                      restarted=restarted_jobs(desired, observed, plan.jobs))
    return checked, errors


def _checked_creates(plan: Plan, desired: DesiredState, problem: Problem, offers: dict) -> tuple[list[CreateAction], list[str]]:
    """The creates that name an offer the pool allows now, priced from the offering (never from the file)."""
    gangs = [d.jobs[0] for d in problem.demands if d.gang and d.gang_mode == "placement-group"]
    creates: list[CreateAction] = []
    errors: list[str] = []
    for n, c in enumerate(plan.creates, 1):
        what = f"create {c.ref} ({c.site.market} {c.site.instance_type} in {c.site.zone}, pool {c.site.pool!r})"
        if c.ref != f"+{n}" or c.key != f"{plan.id}-{n:04d}":
            errors.append(f"{what}: ref {c.ref!r} / key {c.key!r} are not this plan's (+{n}, {plan.id}-{n:04d})")
            continue
        if c.site.pool not in desired.pools:
            errors.append(f"{what}: there is no pool {c.site.pool!r} in the desired state")
            continue
        offer = offers.get(c.offer_key)
        if offer is None:
            s = desired.pools[c.site.pool].spec
            errors.append(f"{what}: the pool does not allow it now (pool: {s.cloud}/{s.region}, zones {', '.join(s.zones)}, "
                          f"types {', '.join(s.instance_types)}, market {s.market}; or outside the guardrails, over the "
                          "spot price cap, or in a capacity cool-off)")
            continue
        if c.placement_group is not None and c.placement_group not in {placement_group_name(desired.fleet, j, c.site.zone) for j in gangs}:
            errors.append(f"{what}: placement group {c.placement_group!r} is not one of this fleet's gangs")
            continue
        if (c.site.provider, c.site.cloud, c.site.region) != (offer.provider, offer.cloud, offer.region):
            errors.append(f"{what}: provider/cloud/region {c.site.provider}/{c.site.cloud}/{c.site.region} are not the pool's "
                          f"({offer.provider}/{offer.cloud}/{offer.region})")
            continue
        creates.append(replace(c, price=offer.price, max_price=offer.on_demand_price if c.site.market == "spot" else None))
    return creates, errors


def _key_errors(creates: list[CreateAction], observed: Observed) -> list[str]:
    """No create's key (nor a retry's, `<key>-N`) is one a live instance of the fleet was launched with. The cloud answers a
    key it has seen with that instance, so apply would take an instance that already runs work for a new one and put the
    plan's replicas on it beside that work (a plan given an earlier plan's id, its keys rewritten to match: audit). A plan
    made by `reconcile plan` cannot do so: its id hashes the fleet it was made against, which holds every live key."""
    # Each live key under itself and every dash-ended prefix of it, so a create's key is one lookup: `<key>` and its
    # retries `<key>-N` (a scan of every instance per create was 50M comparisons for 5k creates on 10k instances).
    held_by: dict[str, list[str]] = {}
    for i in sorted(observed.instances, key=lambda i: i.id):
        key = i.tags.get(TAG_CREATE_KEY) or ""
        if i.alive and key:
            parts = key.split("-")
            for n in range(1, len(parts) + 1):
                held_by.setdefault("-".join(parts[:n]), []).append(i.id)
    errors = []
    for c in creates:
        held = held_by.get(c.key, [])
        if held:
            errors.append(f"create {c.ref}: its key {c.key!r} is the one {', '.join(held)} was launched with; the cloud would "
                          "answer it with that running instance, not a new one (the plan was made for another fleet state, "
                          "or edited)")
    return errors


def _checked_deletes(plan: Plan, desired: DesiredState, instances: dict, host_price: dict) -> tuple[list[DeleteAction], list[str]]:
    """The deletes of instances the plan's observed snapshot has, each once, described as observed."""
    deletes: list[DeleteAction] = []
    errors: list[str] = []
    for d in plan.deletes:
        inst = instances.get(d.instance_id)
        if inst is None:
            errors.append(f"delete {d.instance_id}: not an instance of fleet {desired.fleet!r} in the plan's observed fleet")
            continue
        if any(x.instance_id == inst.id for x in deletes):
            errors.append(f"delete {d.instance_id}: listed twice")
            continue
        deletes.append(DeleteAction(inst.id, Site.of(inst), host_price.get(inst.id, d.price), d.reason))
    return deletes, errors


def _pool_errors(desired: DesiredState, instances: dict, staying: set[str], creates: list[CreateAction]) -> list[str]:
    """Pools the plan's creates take past max_instances."""
    count: dict[str, int] = {}
    for iid in staying:
        count[instances[iid].pool] = count.get(instances[iid].pool, 0) + 1
    for c in creates:
        count[c.site.pool] = count.get(c.site.pool, 0) + 1
    errors = []
    for pool in sorted({c.site.pool for c in creates}):
        hi = desired.pools[pool].spec.max_instances
        if count[pool] > hi:
            errors.append(f"pool {pool}: the plan would run {amount(count[pool], 'instances')}, over its max_instances {hi}")
    return errors


def _job_errors(plan: Plan, desired: DesiredState, observed: Observed, refs: set[str], staying: set[str],
                deletes: list[DeleteAction]) -> list[str]:
    """Every job accounted for once, its action agreeing with what runs, placed only where an instance stays or
    is created, and none kept on an instance the plan deletes."""
    errors = []
    changes = {j.job: j for j in plan.jobs}
    listed = Counter(j.job for j in plan.jobs)
    for name in sorted(n for n, k in listed.items() if k > 1):
        errors.append(f"job {name}: listed more than once")
    for job in sorted(set(desired.jobs) - set(changes)):
        errors.append(f"job {job}: missing from the plan (every job of the desired state must be accounted for)")
    for name in sorted(set(changes) - set(desired.jobs)):
        errors.append(f"job {name}: not in the desired state")
    for name, j in sorted(changes.items()):
        was = tuple(observed.placements.get(name, ()))
        if tuple(j.previous) != was:
            errors.append(f"job {name}: the plan says it ran on {list(j.previous)}, the fleet says {list(was)}")
        bad = [i for i in j.instances if not (i in refs or i in staying)]
        if j.action in ("keep", "place", "move") and bad:
            errors.append(f"job {name}: placed on {', '.join(bad)}, which neither stays nor is created by the plan")
        if j.action in ("evict", "pending") and j.instances:
            errors.append(f"job {name}: {j.action} but placed on {list(j.instances)}")
    for d in deletes:  # residents: every replica on a deleted instance moves off or is evicted
        for name, ids in sorted(observed.placements.items()):
            j = changes.get(name)
            if d.instance_id in ids and j is not None and d.instance_id in j.instances:
                errors.append(f"delete {d.instance_id}: job {name} runs on it and the plan keeps it there")
    return errors


def _quota_errors(problem: Problem, creates: list[CreateAction], offers: dict) -> list[str]:
    """Creates past a cloud account quota's headroom, in the plan's order (the order apply launches them in)."""
    book, errors = QuotaBook(problem.quotas), []
    for c in creates:
        cap = offers[c.offer_key]
        short = book.short(cap)
        if short is not None:
            q = book.quotas[short[0]]
            taken = f", and the plan's creates before it take {amount(book.taken[short[0]], q.unit)} more" if book.taken[short[0]] else ""
            errors.append(f"create {c.ref} ({c.site.market} {c.site.instance_type} in {c.site.zone}, pool {c.site.pool!r}): cloud quota: "
                          f"{quota_scope(q)}: {q.used:g} of {amount(q.limit, q.unit)} used when read{taken}; it needs "
                          f"{amount(quota_units(q, cap), q.unit)} more" + (f"; raise it: {q.how_to_raise}" if q.how_to_raise else ""))
        book.take(cap)
    return errors


FLEET_RULES = ("spot-share", "spot-buffer", "spot-diversity", "tenant-spot", "license", "pool-min")


def _fleet_rule_errors(after, broken_now: dict[str, str], rules: tuple[str, ...] = FLEET_RULES) -> list[str]:
    """Fleet-wide rules the plan breaks that the fleet keeps now, as it runs and without the instances that must go:
    the spot share, the on-demand buffer, spot diversity, tenants' spot shares, license counts and pool minimums (budgets,
    pool maximums and ceilings are checked above). (Greedy's plan on fleet26 gave up a pool's only instance and bought
    none for its min_instances: the re-check let it through.)"""
    return [f"the plan breaks a rule the fleet keeps now: {why}" for rule, why in sorted(after.broken_rules().items())
            if rule not in broken_now and rule.split(":")[0] in rules]


def pool_min_errors(plan: Plan, desired: DesiredState, observed: Observed, problem: Problem) -> list[str]:
    """The pool minimums `plan` leaves unmet, as `recheck` refuses them: a minimum the fleet keeps now that the plan
    breaks, or one it is under now that the plan leaves unmet where it could do better (_pool_min_errors: a minimum a
    capacity cool-off, a cloud quota or the budget keeps the planner from meeting is no one's fault). For callers that
    check a plan's pools against apply's rule without the rest of the re-check (the tests' oracle, tests/invariants.py,
    had its own rule: a pool under min_instances only ever excused by a cloud quota)."""
    offers = {c.offer_key: c for c in problem.offers()}
    creates, _ = _checked_creates(plan, desired, problem, offers)
    instances = {i.id: i for i in observed.instances}
    deletes, _ = _checked_deletes(plan, desired, instances, {c.instance_id: c.price for c in problem.hosts()})
    staying = set(instances) - {d.instance_id for d in deletes} - {d.instance_id for d in plan.deletes}
    ledgers = _ledgers(plan, problem, creates, staying)
    if ledgers is None:
        return []  # (a job with the wrong number of replicas: recheck refuses the plan for that)
    after, before = ledgers
    broken_now = rules_broken_now(problem) | before.broken_rules()
    return _fleet_rule_errors(after, broken_now, ("pool-min",)) + _pool_min_errors(problem, after, broken_now, creates)


def _pool_min_errors(problem: Problem, after, broken_now: dict[str, str], creates: list[CreateAction]) -> list[str]:
    """Pools under their min_instances now (quota-lowered, as the planner reads them: problem.pool_bounds) that the
    plan leaves under it where it could do better, as the planner would: with fewer instances than the fleet can keep
    there, or without an instance of the pool's offers that breaks no rule (the ledger's: reservation, max_instances,
    cloud quota, budget, the spot rules) bought for it. A minimum the planner cannot meet (a zone in a capacity
    cool-off has no offer, a quota no room, the budget none) is no one's fault: such a plan stays acceptable. (Under
    its minimum now, a pool was let through empty: `pool-min` broken now licensed any plan for it, one that bought
    nothing for the minimum or even deleted the pool's last instance. A minimum the fleet keeps is _fleet_rule_errors'.)"""
    errors = []
    bought = Counter(c.offer_key for c in creates)
    for pool, (lo, _) in sorted(problem.pool_bounds.items()):
        have = after.pool_count(pool)
        if f"pool-min:{pool}" not in broken_now or have >= lo:
            continue
        can_stay = sum(1 for h in problem.hosts() if h.pool == pool and h.keep_blocker is None)
        if have < min(lo, can_stay):
            errors.append(f"pool {pool}: the plan leaves {amount(have, 'instances')}, under its min_instances {lo}, where the fleet "
                          f"keeps {amount(can_stay, 'instances')} (a pool under its minimum may not lose an instance it can keep)")
            continue
        floor = (f"its minimum {lo} ({problem.quota_floors[pool].removeprefix(f'pool {pool}: ')})" if pool in problem.quota_floors
                 else f"its min_instances {lo}")
        buyable = _rule_keeping_offer(after, [c for c in problem.offers() if c.pool == pool and not c.members
                                              and bought[c.offer_key] < c.max_new])
        if buyable is not None:
            errors.append(f"pool {pool}: the plan leaves {amount(have, 'instances')}, under {floor}, where one more "
                          f"{buyable.market} {buyable.instance_type} in {buyable.zone} breaks no rule (the planner buys it)")
    return errors


def _rule_keeping_offer(after, offers: list[Capacity]) -> Capacity | None:
    """The cheapest offer one more instance of which the plan's fleet (`after`) takes with no rule broken that it
    keeps, as the planner opens one for a pool minimum; None if each breaks one."""
    broken = set(after.broken_rules())
    for c in sorted(offers, key=lambda c: (c.price, c.key)):
        if after.open_rules(c, 1):
            continue
        after.add_instance("+pool-min", c)
        try:
            if set(after.broken_rules()) <= broken:
                return c
        finally:
            after.remove_instance("+pool-min")
    return None


def _gang_errors(plan: Plan, observed: Observed, problem: Problem, creates: list[CreateAction]) -> list[str]:
    """A job's replicas arriving anywhere stay together as its gang mode asks: one zone; one instance
    (instance); one instance type and one placement group (placement-group)."""
    demand_of = {j: d for d in problem.demands for j in d.jobs}
    site = {i.id: (i.cloud, i.zone, i.instance_type, i.placement_group or None) for i in observed.instances}
    site |= {c.ref: (c.site.cloud, c.site.zone, c.site.instance_type, c.placement_group) for c in creates}
    errors = []
    for j in plan.jobs:
        d = demand_of.get(j.job)
        if d is None or j.action not in ("place", "move") or len(j.instances) < 2 or any(i not in site for i in j.instances):
            continue  # (a keep leaves a gang as it runs; unknown instances are refused above)
        where = [site[i] for i in j.instances]
        if len({(c, z) for c, z, _, _ in where}) > 1:
            errors.append(f"job {j.job}: its replicas span zones {sorted({z for _, z, _, _ in where})}; a gang runs in one zone")
        elif d.gang_mode == "instance" and len(set(j.instances)) > 1:
            errors.append(f"job {j.job}: gang: instance, but its replicas span {amount(len(set(j.instances)), 'instances')}")
        elif d.gang_mode == "placement-group":
            new_groups = {g for i, (_, _, _, g) in zip(j.instances, where) if i in {c.ref for c in creates}}
            if len({t for _, _, t, _ in where}) > 1 or None in new_groups or len(new_groups) > 1:
                errors.append(f"job {j.job}: gang: placement-group, but its replicas span instance types "
                              f"{sorted({t for _, _, t, _ in where})} or placement groups {sorted(map(str, new_groups))}")
    return errors


def unlawful_evictions(plan: Plan, observed: Observed, problem: Problem) -> dict[str, str]:
    """The re-check's rule on evictions (`_eviction_errors`), asked of a plan the planner just made: a plan whose
    guarantees tier was not proven could stop a job inside its tenant's guarantee that no rule requires stopping
    (bench.explore_mixed's fleet 80 after tenant quotas were set: team-2's job-00007), and `reconcile apply` without
    --plan would have carried it out unchecked. The fleet as it runs is read by the one ledger the re-check reads:
    rules_broken_now holds what it breaks already (its rules are the running ledger's `|` the staying one's, the running
    one's read last), so it is not built again here (one ledger of the 10,857 instances and 4,400 running jobs of the
    applied 5k fleet: ~0.1 s of CPU of its PR plans)."""
    if not any(j.action == "evict" for j in plan.jobs):
        return {}
    gone = {d.instance_id for d in plan.deletes}
    staying = {c.instance_id for c in problem.hosts()} - gone
    return _unlawful(plan, observed, problem, rules_broken_now(problem),
                     lambda: KeptInstead.of(plan, observed, problem, staying, list(plan.creates)))


def _eviction_errors(plan: Plan, observed: Observed, problem: Problem, broken_now: dict[str, str],
                     kept_instead: Callable[[], KeptInstead | None]) -> list[str]:
    """Evictions no rule requires: an edited `keep` -> `evict` would otherwise stop another team's
    guaranteed work. The exemptions are the reasons the planner evicts for (issue 18)."""
    return list(_unlawful(plan, observed, problem, broken_now, kept_instead).values())


def _unlawful(plan: Plan, observed: Observed, problem: Problem, broken_now: dict[str, str],
              kept_instead: Callable[[], KeptInstead | None]) -> dict[str, str]:
    """Evicted job -> why no rule requires its stop (`_eviction_errors`). Where the fleet breaks a fleet-wide rule now,
    something must give and the planner chooses what: a stop is then lawful where the plan with the job kept where it
    runs instead breaks a rule the plan keeps (`KeptInstead`), not merely because some rule is broken (with one
    interrupted instance under a pool's minimum, an edited plan stopped two tenants' guaranteed work and gave one's
    T4 to another tenant's new job, and apply carried it out)."""
    demand_of = {j: d for d in problem.demands for j in d.jobs}
    hosts = {c.instance_id: c for c in problem.hosts()}
    evicts = [j for j in plan.jobs if j.action == "evict" and j.job in demand_of and observed.placements.get(j.job)]
    licensed = licensed_by(broken_now)
    if not evicts:
        return {}
    fleet_broken = licensed is None
    if fleet_broken:  # (a tenant's own rule broken beside it still lets that tenant's work go, as alone)
        licensed = licensed_by({r: w for r, w in broken_now.items() if r.startswith("tenant-")})
    over_cap, borrowing = over_cap_tenants(problem.demands, problem.tenants), borrowing_tenants(problem.demands, problem.tenants)
    # (work that needs capacity anew: placed, restarted in a new shape, or a gang that does not run whole now, healed
    # around its survivors or grown, as the planner counts it: not protected, new work; refusing its evictions refused
    # every plan that healed a critical gang in a low job's room after a spot interruption, tests/data/findings/fleet31.txt)
    # (and a running job a rule moves, placed elsewhere: it needs room as new work does, the model's wants_room and
    # forced movers; refusing its evictions refused every plan of a fleet whose normal spot-required job had to leave
    # an on-demand host for its tenant's low job's spot room, fleet60)
    leaving = jobs_that_must_leave(problem)
    arriving = _arriving(plan, observed, demand_of, leaving)
    # (of a class of identical jobs, as many kept as it has protected ones keep its guarantee: a kept identical job stands in
    # for an evicted protected one, as the model counts it, objective.protected_tier. By name, a fixed pool whose tenant
    # b ran 16 identical 1-GPU jobs on two hosts, 8 guaranteed, and tenant a asking for its guaranteed 8: CP-SAT gave a
    # the host where b's protected names ran and kept b's others on the second, and the plan fell back to greedy's,
    # which left all of a's guaranteed work pending beside b's borrowed jobs)
    kept = Counter(demand_of[j.job].key for j in plan.jobs if j.action in ("keep", "move") and j.job in demand_of
                   and observed.placements.get(j.job))
    protected = {t: set(r.protected_jobs) for t, r in problem.tenants.items()}
    by_tenant = TenantMoves.of(plan, demand_of, arriving)
    rebought = slots_bought_again(plan, observed, problem)
    # (its spot share lets its spot work go, its ceiling its work in a dimension it is over, its budget any: the stop of
    # its on-demand work makes its spot share worse, that of its CPU job mends no GPU ceiling; audit: each was applied)
    use = running_use(problem.demands)

    def own_rule_lets_go(d: Demand, ids) -> bool:
        kinds = {r.split(":", 1)[0] for r in broken_now if r.startswith("tenant-") and r.split(":", 1)[1] == d.tenant} \
            if d.tenant in licensed else set()
        kinds |= {"tenant-cap"} if d.tenant in over_cap else set()
        if kinds - {"tenant-spot", "tenant-cap"}:
            return True  # (its budget)
        if "tenant-spot" in kinds and any(i in hosts and hosts[i].market == "spot" for i in ids):
            return True
        cap = problem.tenants[d.tenant].cap if "tenant-cap" in kinds and d.tenant in problem.tenants else {}
        return any(d.req(k) and not quota_ok(use.get(d.tenant, {}).get(k, 0.0), 0.0, v) for k, v in cap.items())
    whys: dict[str, str] = {}
    for jc in evicts:
        d, ids = demand_of[jc.job], observed.placements[jc.job]
        if jc.job in d.reshaped or len(ids) != d.replicas * d.bundle or own_rule_lets_go(d, ids):
            continue  # (a tenant's own rule broken now, its spot share say, lets its work go; not another tenant's: fleet37)
        if any(i not in hosts for i in ids) or jc.job in leaving:
            continue  # it cannot stay where it runs
        rules = problem.tenants.get(d.tenant)
        if rules is not None and jc.job in protected[d.tenant] and kept[d.key] < sum(j in protected[d.tenant] for j in d.jobs):
            whys[jc.job] = (f"job {jc.job}: evicted, but it runs inside tenant {d.tenant}'s guarantee and no rule requires "
                            "stopping it (only the planner's rules may: a higher class of its own tenant taking its room, its "
                            "tenant over its ceiling, a fleet-wide rule that keeping it would break, or its instance unable to keep it)")
        elif d.tenant not in borrowing:
            whys[jc.job] = (f"job {jc.job}: evicted, but no rule requires stopping it (its tenant {d.tenant} borrows nothing, "
                            "and it may stay where it runs)")
    taken = set()  # (higher-class work of its own tenant takes their place)
    if problem.placement.preemption == "LowerPriority" and whys:
        taken = own_higher_class_room([(j, observed.placements[j]) for j in whys], observed, demand_of, by_tenant, problem, rebought)
    errors = {job: why for job, why in whys.items() if job not in taken}
    # Something must give for the rules broken now: a stop keeping which breaks one the plan keeps is lawful. Any
    # tenant's job where a fleet-wide rule is broken; else a job of a tenant whose own rule is (its ceiling, budget or
    # spot share): t3 over its GPU ceiling must stop its 1-GPU on-demand job, and its MIG job then left alone on spot
    # breaks its spot share 0.5, so both go; the MIG job, inside its guarantee (MIG counts no GPUs of the ceiling),
    # was refused, every plan with it (fleet132).
    own = (licensed or set()) | over_cap
    weighed = list(errors) if fleet_broken else [job for job in errors if demand_of[job].tenant in own]
    if weighed:
        weigh = kept_instead()
        for job in (sorted(weighed, key=weigh.order) if weigh is not None else weighed):
            if weigh is None or weigh.breaks_a_rule(job):
                del errors[job]
            else:
                errors[job] += (f"; the fleet breaks {', '.join(sorted(broken_now))} now, but the plan with it kept where it "
                                "runs, and whatever took its room where it was, breaks no rule the plan keeps")
        if weigh is not None:
            weigh.done()
    return errors


def _arriving(plan: Plan, observed: Observed, demand_of: dict[str, Demand], leaving: set[str]) -> list:
    """The plan's work that needs capacity anew, as the planner counts it (`_unlawful`): placed, restarted in a new
    shape, a gang that does not run whole now, or a running job a rule moves (`leaving`), placed elsewhere."""
    return [j for j in plan.jobs if j.job in demand_of and (
        j.action == "place" or j.action in ("keep", "move") and (
            j.job in demand_of[j.job].reshaped or len(observed.placements.get(j.job, ())) != demand_of[j.job].replicas * demand_of[j.job].bundle
            or j.action == "move" and j.job in leaving))]


@dataclass(frozen=True)
class TenantMoves:
    """A tenant's part of a plan, as `own_higher_class_room` reads it for each of its evicted jobs: its moves, the use
    of the work it keeps or moves (every dimension), and its arriving work (placed, or restarted as new) by class.
    Made once per check: read per eviction from the plan's whole job list, a plan of thousands of evictions cost
    evictions x jobs."""

    moves: tuple = ()
    kept_use: dict = field(default_factory=dict)
    arriving: tuple = ()  # (class, JobChange), arriving work

    @staticmethod
    def of(plan: Plan, demand_of: dict[str, Demand], arriving) -> dict[str, TenantMoves]:
        moves: dict[str, list] = {}
        use: dict[str, dict[str, float]] = {}
        came: dict[str, list] = {}
        for j in plan.jobs:
            d = demand_of.get(j.job)
            if d is None or j.action not in ("keep", "move"):
                continue
            if j.action == "move":
                moves.setdefault(d.tenant, []).append(j)
            u = use.setdefault(d.tenant, dict.fromkeys(DIMS, 0.0))
            for k in DIMS:
                u[k] += d.req(k) * d.replicas
        for j in arriving:
            came.setdefault(demand_of[j.job].tenant, []).append((demand_of[j.job].klass, j))
        return {t: TenantMoves(tuple(moves.get(t, ())), use.get(t, dict.fromkeys(DIMS, 0.0)), tuple(came.get(t, ())))
                for t in set(moves) | set(use) | set(came)}


class KeptInstead:
    """The plan with an evicted job kept where it runs instead, as the eviction rule weighs a stop while the fleet
    breaks a fleet-wide rule now (`_unlawful`): something must give, and the stop is lawful where keeping the job
    breaks a rule, by the one ledger (reconciler/ledger.py) of the fleet the plan leaves. Kept instead, the plan is
    read as the rules rank its parts above the job: the job on its instances (those the plan deletes kept too); new
    work (placed, restarted in a new shape, a gang re-forming, a job a rule moves: `_arriving`) waits, but its own
    tenant's of a higher class (the only new work a running job inside its guarantee gives way to), and so does
    running work outside its tenant's guarantee (borrowed: it goes before guaranteed work); running work that took its
    room goes back where it ran (its instance kept too, if the plan deletes it), and the work that took that room in
    turn, and so on; running work moved elsewhere for no rule goes back where it ran, where it fits there and no rule
    the plan keeps then breaks; instances left standing idle that no rule asks for are not bought, nor kept (padding).
    The stop is lawful where that plan breaks a rule the same plan without the job keeps. Work in its room that cannot
    go back (it must leave where it ran, a gang re-forming, its tenant's higher class) was moved by a rule or outranks
    it: the planner chose what gives. A replacement the plan buys in the slot of an instance it deletes (its pool at
    max_instances: slots_bought_again) counts as the job's room. (Edited plans while one instance was under a pool's minimum: guaranteed work stopped for nothing, for
    another tenant's new job on its T4 or an identical T4 bought for it, for a job moved off an instance deleted for no
    rule, for idle instances bought up to the budget: each passed. Then (audit): another tenant's job moved onto the
    stopped job's GPU index on its own instance, another tenant's job that must leave its host or gang re-forming put
    in its room, another tenant's job moved to a dearer new instance up to the budget, an idle instance kept past a
    lowered max_instances while the stopped job's was deleted, and a license lowered below what runs kept by another
    tenant's borrowed job: each passed.)"""

    def __init__(self, plan: Plan, observed: Observed, problem: Problem, led, staying: set[str], creates: list[CreateAction]) -> None:
        """`led`: the plan's ledger, this object's own (each weighing changes it and puts it back)."""
        self.plan_jobs = {j.job: j for j in plan.jobs}
        self.observed, self.problem, self.led, self.staying = observed, problem, led, staying
        self.demand_of = {j: d for d in problem.demands for j in d.jobs}
        self.hosts = {c.instance_id: c for c in problem.hosts()}
        offers = {c.offer_key: c for c in problem.offers()}
        self.caps: dict[str, Capacity] = {i: self.hosts[i] for i in staying if i in self.hosts}
        self.caps |= {c.ref: offers[c.offer_key] for c in creates if c.offer_key in offers}
        self.rebought = slots_bought_again(plan, observed, problem)
        # (spot first: spot padding gone, the on-demand buffer may ask for less; the plan's new instances, then those it keeps)
        spot_first = lambda r: led.instances[r].market != "spot"  # noqa: E731
        self.creates = sorted((c.ref for c in creates if c.ref in led.instances), key=spot_first)
        self.creates += sorted((i for i in staying if i in led.instances), key=spot_first)
        self.residents: dict[str, list[tuple[str, int, tuple[int, ...]]]] = {}
        for j in plan.jobs:
            if j.action in ("keep", "place", "move") and j.job in self.demand_of:
                for r, target in enumerate(j.instances):
                    self.residents.setdefault(target, []).append((j.job, r, tuple(j.gpus[r]) if j.gpus and r < len(j.gpus) else ()))
        self.leaving = jobs_that_must_leave(problem)
        self.new = sorted(j.job for j in _arriving(plan, observed, self.demand_of, self.leaving))
        arriving = set(self.new)
        running = [j for j in plan.jobs if j.action in ("keep", "move") and j.job in self.demand_of and j.job not in arriving
                   and observed.placements.get(j.job)]
        self.borrowed = _borrowed([j.job for j in running], problem, self.demand_of)
        self.movers = sorted(j.job for j in running if j.action == "move" and j.job not in self.borrowed
                             and all(i in self.hosts for i in observed.placements[j.job]))
        self._key: tuple[str, int] | None = None
        self._group: list = []  # what _enter changed in the ledger
        self._waits: set[str] = set()
        self._back: set[str] = set()  # running work _enter put back where it ran
        self._base: set[str] = set()
        self._padding: list = []  # (ref, capacity) of the idle instances _enter took
        self._came: dict = {}  # target (or ("slot", a deleted instance)) -> what arrives there: the plan's, read once

    @staticmethod
    def of(plan: Plan, observed: Observed, problem: Problem, staying: set[str], creates: list[CreateAction]) -> KeptInstead | None:
        """None for a plan whose jobs have other replica counts than they ask (refused for that)."""
        ledgers = _ledgers(plan, problem, creates, staying)
        return None if ledgers is None else KeptInstead(plan, observed, problem, ledgers[0], staying, creates)

    def order(self, job: str) -> tuple:
        """The order to weigh stops in: by tenant and class, the part of the plan that waits for them is the same."""
        d = self.demand_of[job]
        return d.tenant, d.klass, job

    def breaks_a_rule(self, job: str) -> bool:
        d, ids = self.demand_of[job], tuple(self.observed.placements[job])
        self._enter((d.tenant, d.klass))
        takers = self._takers(job, ids, self._waits)
        if takers is None:
            return True
        undo: list = []
        try:
            base = self._base
            if takers:
                for t in sorted(takers):
                    self._off(t, undo)
                base = self._without_padding(undo)
                for t in sorted(takers):
                    self._on(t, self.observed.placements[t], undo)
            self._on(job, ids, undo)
            for ref, cap in self._padding:  # (the padding offered again: kept, the job may be what it is there for, spot ballast)
                if ref not in self.led.instances:
                    self.led.add_instance(ref, cap)
                    undo.append(("inst-", None, None, ref))
            return bool((self._without_padding(undo) if takers or self._padding else set(self.led.broken_rules())) - base)
        finally:
            self._undo(undo)

    def _enter(self, key: tuple[str, int]) -> None:
        """The plan as weighed for a stop of tenant key[0]'s class key[1]: the new work and the borrowed work that rank
        below it waiting, the padding then not bought nor kept, and the running work moved for no rule back where it
        ran (made once per tenant and class: a plan's new work is read once, not per stop)."""
        if self._key == key:
            return
        self.done()
        tenant, klass = key
        self._waits = {t for t in self.new + self.borrowed if not (self.demand_of[t].tenant == tenant and self.demand_of[t].klass > klass)}
        for t in sorted(self._waits):
            self._off(t, self._group)
        self._give_back_room(self._waits)
        self._base = self._without_padding(self._group)
        self._put_back([t for t in self.movers if t not in self._waits])
        self._padding = [(ref, cap) for op, cap, _, ref in self._group if op == "inst+" and ref not in self.led.instances]
        self._key = key

    def _give_back_room(self, waits: set[str]) -> None:
        """The guaranteed running work that waiting new work of its own tenant's higher class took the room of (the
        stop its tenant's guarantee allowed for it) back where it ran, where it fits there: with that work waiting, the
        tenant keeps its guarantee by its running job again. Left stopped, one tenant's guarantee counted for nothing
        against another's: with one slot left by a pool's max for t2's normal job and t3's running normal job, whose
        room t3's new high job took, keeping t2's job "broke no rule" (t3's high job waiting, its host idle) and both
        planners' plans were refused (tests/data/findings/fleet90)."""
        took: dict[tuple[str, str], int] = {}  # (tenant, host) -> the highest class of its waiting work placed there
        for t in waits:
            w = self.demand_of[t]
            for ref in self.plan_jobs[t].instances:
                took[(w.tenant, ref)] = max(took.get((w.tenant, ref), -1), w.klass)
        if not took:
            return
        for jc in self.plan_jobs.values():
            ids = tuple(self.observed.placements.get(jc.job, ()))
            e = self.demand_of.get(jc.job)
            if jc.action != "evict" or not ids or e is None or e.tenant not in self.problem.tenants \
                    or jc.job not in self.problem.tenants[e.tenant].protected_jobs or jc.job in self.leaving \
                    or jc.job in e.reshaped or len(ids) != e.replicas * e.bundle or any(i not in self.hosts for i in ids):
                continue
            if not any(took.get((e.tenant, i), -1) > e.klass for i in ids):
                continue
            if all(i not in self.staying or self._fits([jc.job], i, waits) for i in dict.fromkeys(ids)):
                self._on(jc.job, ids, self._group)
                self._back.add(jc.job)

    def _put_back(self, movers: list[str]) -> None:
        """Running work the plan moves for no rule back where it ran, all of it at once, else each alone: where it fits
        there again and no rule the plan keeps then breaks (a move to a dearer instance, or into another's room, makes
        no stop's need; a move that mends a rule, to a cheaper instance under the budget say, stays)."""
        for group in ([movers] if len(movers) > 1 else []) + [[t] for t in movers]:
            if group[0] in self._back:
                continue
            trial = self._back | set(group)
            if not all(i not in self.staying or self._fits([t for t in group if i in self.observed.placements[t]], i, self._waits | trial)
                       for i in sorted({i for t in group for i in self.observed.placements[t]})):
                continue
            undo: list = []
            for t in group:
                self._off(t, undo)
            for t in group:
                self._on(t, self.observed.placements[t], undo)
            now = self._without_padding(undo)
            if now <= self._base:
                self._group += undo
                self._base, self._back = now, trial
            else:
                self._undo(undo)

    def done(self) -> None:
        """The ledger as the plan leaves it again."""
        self._undo(self._group)
        self._group, self._key, self._back, self._padding = [], None, set(), []

    def _undo(self, undo: list) -> None:
        for op, a, b, c in reversed(undo):
            if op == "item+":
                self.led.add_item(a, b, c)
            elif op == "item-":
                self.led.remove_item(a, b, c)
            elif op == "inst+":
                self.led.add_instance(c, a)
            else:
                self.led.remove_instance(c)
        undo.clear()

    def _takers(self, job: str, ids: tuple[str, ...], waits: set[str]) -> set[str] | None:
        """The running work that goes back where it ran for `job` to stay: what arrived in its room, and what arrived in
        theirs in turn. None where some of it cannot go back (the planner's choice stands)."""
        takers: set[str] = set()
        rooms = [(job, i) for i in dict.fromkeys(ids)]
        while rooms:
            who, i = rooms.pop()
            if i in self.staying:
                fits = self._fits([who], i, waits | takers)
                came = set() if fits else self._arrived(i) - waits - takers - self._back - {job}
                if not came and not fits:
                    return None  # (no work it could go back beside: a rule's choice, or the running fleet overfull)
            elif i in self.hosts and who == job:
                came = self._bought_for(i) - waits - takers - self._back
            else:
                came = set()
            for t in sorted(came):
                was, q = tuple(self.observed.placements.get(t, ())), self.demand_of[t]
                if not was or t in q.reshaped or t in self.leaving or len(was) != q.replicas * q.bundle or \
                        any(i not in self.hosts for i in was):
                    return None  # its tenant's higher class, moved by a rule, or a gang re-forming
                takers.add(t)
                rooms += [(t, w) for w in dict.fromkeys(was)]
        return takers

    def _arrived(self, target: str) -> set[str]:
        """Jobs the plan puts on `target` with more replicas than run there now."""
        came = self._came.get(target)
        if came is None:
            reps = Counter(j for j, _, _ in self.residents.get(target, ()))
            came = self._came[target] = {j for j, n in reps.items() if n > sum(i == target for i in self.observed.placements.get(j, ()))}
        return came

    def _bought_for(self, deleted: str) -> set[str]:
        """What arrives on the plan's new instances in the slot of an instance it deletes (`slots_bought_again`: its
        room, bought again). Read as any new instance of its pool, a pool with room for both, another fleet-wide rule
        broken now, let t1's high job bought beside it stand in for its low job on the deleted one: stopped for nothing."""
        came = self._came.get(("slot", deleted))
        if came is None:
            came = self._came[("slot", deleted)] = {t for ref in self.rebought.get(deleted, ()) for t in self._arrived(ref)}
        return came

    def _fits(self, jobs: list[str], target: str, without: set[str]) -> bool:
        """Whether the replicas of `jobs` that ran on `target` fit there again as they ran, beside what the plan leaves
        on it (but `without`, and the work put back elsewhere) and the work put back there as it ran. Work the plan
        leaves where it runs is read as it runs, on the GPUs it holds, whatever GPUs the plan writes for it (audit: a
        job moved in place onto the stopped job's GPU, or kept with GPUs never recorded written as its, made the stopped
        job "not fit" where it ran)."""
        cap = self.caps.get(target)
        if cap is None:
            return False
        skip, came = set(without) | set(jobs) | self._back, self._arrived(target)
        others = [r for r in self.residents.get(target, ()) if r[0] not in skip and r[0] in came]
        stay = sorted({r[0] for r in self.residents.get(target, ()) if r[0] not in skip and r[0] not in came} |
                      {t for t in self._back - set(jobs) if target in self.observed.placements.get(t, ())})
        taken = {g for _, _, gpus in others for g in gpus}
        for t in stay + list(jobs):  # (GPUs recorded first: unrecorded replicas take free ones)
            rec = self.observed.gpu_indices.get(t) or ()
            taken.update(g for r, iid in enumerate(self.observed.placements.get(t, ())) if iid == target and r < len(rec) for g in rec[r])
        left = Counter(r[0] for r in self.residents.get(target, ()))  # (as many of its replicas as the plan leaves there)
        others += [r for t in stay for r in self._as_ran(t, target, cap, taken, None if t in self._back else left[t])]
        mine = [r for t in jobs for r in self._as_ran(t, target, cap, taken)]
        with_it = _instance_errors(target, cap, others + mine, self.demand_of, self.observed)
        return not with_it or set(with_it) <= set(_instance_errors(target, cap, others, self.demand_of, self.observed))

    def _as_ran(self, job: str, target: str, cap: Capacity, taken: set[int], most: int | None = None) -> list[tuple[str, int, tuple[int, ...]]]:
        """Job's replicas that run on `target` (at most `most`), on the GPUs they run on (not recorded: free ones, then taken)."""
        rec = self.observed.gpu_indices.get(job) or ()
        mine: list[tuple[str, int, tuple[int, ...]]] = []
        for r, iid in enumerate(self.observed.placements[job]):
            if iid != target or most is not None and len(mine) >= most:
                continue
            if r < len(rec):
                mine.append((job, r, tuple(rec[r])))
                continue
            n = _whole_gpus(self.demand_of[job], cap)  # (indices not recorded: any free ones)
            free = [g for g in range(cap.gpus) if g not in taken][:n]
            taken.update(free)
            mine.append((job, r, tuple(free)))
        return mine

    def _off(self, t: str, undo: list) -> None:
        """Job t's items off where the plan puts them."""
        q = self.demand_of[t]
        for ref in self.plan_jobs[t].instances[:: q.bundle]:
            if ref in self.led.instances:
                self.led.remove_item(q, t, ref)
                undo.append(("item+", q, t, ref))

    def _on(self, t: str, where, undo: list) -> None:
        """Running job t's items where it runs, as it runs (the instances the plan deletes kept)."""
        q = self.demand_of[t].as_it_runs(t)
        for ref in where[:: q.bundle]:
            if ref not in self.led.instances:
                self.led.add_instance(ref, self.hosts[ref])
                undo.append(("inst-", None, None, ref))
            self.led.add_item(q, t, ref)
            undo.append(("item-", q, t, ref))

    def _without_padding(self, undo: list) -> set[str]:
        """Take the instances the plan buys or keeps left idle whose absence breaks no rule it breaks not already out
        (an on-demand buffer, spot ballast, a pool's minimum, spot diversity ask for theirs); the rules then broken."""
        led = self.led
        broken = set(led.broken_rules())
        for ref in self.creates:
            if ref in led.instances and not led.items[ref]:
                cap = led.instances[ref]
                led.remove_instance(ref)
                now = set(led.broken_rules())
                if now <= broken:
                    broken = now
                    undo.append(("inst+", cap, None, ref))
                else:
                    led.add_instance(ref, cap)
        return broken


def _borrowed(running: list[str], problem: Problem, demand_of: dict[str, Demand]) -> list[str]:
    """Of the running jobs a plan keeps or moves, those outside their tenant's guarantee (its borrowed work: a tenant
    that borrows, past as many of each class of identical jobs as it protects, the jobs it does not name first)."""
    borrowing = borrowing_tenants(problem.demands, problem.tenants)
    by_key: dict = {}
    for j in running:
        d = demand_of[j]
        if d.tenant in borrowing and d.tenant in problem.tenants:
            by_key.setdefault(d.key, []).append(j)
    out = []
    for jobs in by_key.values():
        d = demand_of[jobs[0]]
        protected = set(problem.tenants[d.tenant].protected_jobs)
        over = len(jobs) - sum(j in protected for j in d.jobs)
        if over > 0:
            out += sorted(jobs, key=lambda j: (j not in protected, j))[-over:]
    return sorted(out)


def slots_bought_again(plan: Plan, observed: Observed, problem: Problem) -> dict[str, tuple[str, ...]]:
    """Instance the plan deletes -> the plan's new instances in its pool, where the pool ends at its max_instances: the
    deleted instance's slot, bought again: its room there (own_higher_class_room's, and `KeptInstead._bought_for`'s).
    Only at max_instances: below it, the pool has room for the deleted instance beside them. A pool observed over its
    max_instances counts too: the plan must give up some of it, and keeping a deleted instance still puts out a new one."""
    gone = {d.instance_id for d in plan.deletes}
    count = Counter(i.pool for i in observed.instances if i.id not in gone)
    count.update(c.site.pool for c in plan.creates)
    new: dict[str, list[str]] = {}
    for c in plan.creates:
        new.setdefault(c.site.pool, []).append(c.ref)
    return {i.id: tuple(new[i.pool]) for i in observed.instances if i.id in gone and i.pool in new
            and i.pool in problem.pool_bounds and count[i.pool] >= problem.pool_bounds[i.pool][1]}


def own_higher_class_room(stops: list[tuple[str, tuple[str, ...]]], observed: Observed, demand_of: dict[str, Demand],
                          by_tenant: dict[str, TenantMoves], problem: Problem, rebought: dict[str, tuple[str, ...]]) -> set[str]:
    """Of the stops of running jobs no other rule requires (job, the instances it ran on), those that are their own
    tenant's higher class taking their place, whole (`own_higher_class_units`)."""
    units = own_higher_class_units(stops, observed, demand_of, by_tenant, problem, rebought)
    return {job for job, n in units.items() if n >= demand_of[job].job_size}


def stood_in_units(plan: Plan, observed: Observed, problem: Problem, stops: list[str], not_new: frozenset[str] = frozenset()) -> dict[str, int]:
    """Of the plan's stopped running jobs `stops`, the units (Demand.job_size) its tenants' higher-class work stands in for
    by the rule the re-check applies (`own_higher_class_units`): what the guarantees tiers of a finished plan count
    (plan.quality.guarantee_kept). `not_new`: running jobs counted as kept units, not as new work (the second tier's
    jobs that must move)."""
    demand_of = {j: d for d in problem.demands for j in d.jobs}
    stops = [j for j in stops if j in demand_of and observed.placements.get(j)]
    if not stops:
        return {}
    arriving = [j for j in _arriving(plan, observed, demand_of, jobs_that_must_leave(problem)) if j.job not in not_new]
    return own_higher_class_units([(j, tuple(observed.placements[j])) for j in stops], observed, demand_of,
                                  TenantMoves.of(plan, demand_of, arriving), problem, slots_bought_again(plan, observed, problem))


def own_higher_class_units(stops: list[tuple[str, tuple[str, ...]]], observed: Observed, demand_of: dict[str, Demand],
                           by_tenant: dict[str, TenantMoves], problem: Problem, rebought: dict[str, tuple[str, ...]]) -> dict[str, int]:
    """Of the stops of running jobs (job, the instances it ran on), the units of each that are its own tenant's higher
    class taking its place (README, Tenants: its guaranteed work gives way only to a higher class of
    its own tenant, never to another tenant's work). So the tenant's arriving work (`TenantMoves.arriving`: placed, or
    restarted, as new work) of a higher class must take the job's room: land on an instance it ran on, or on one a job
    of its tenant left to move into that room (a chain of moves: `_room`); or the tenant's guarantee must be full
    without it (`_guarantee_full_without`). Its tenant's critical job placed on a new instance elsewhere excused the
    stop of its normal job, whose room another tenant's job took: that tenant took the guarantee (fixed pool of one
    m6i.4xlarge, tests/test_rules.py). An instance it ran on that the plan deletes to buy another in its pool at
    max_instances (`rebought`: slots_bought_again) leaves its room there: t1's critical job on a new on-demand A100 in
    the slot of its high job's spot one was refused, the plan placed it on the spot one, and the plan after the apply
    moved it to the on-demand one all the same (fleet111).

    Counted in units, as the model counts its stand-in rooms (objective.stand_in_room): each unit of higher work placed
    in a room (ledger.stand_in_item_units) stands in for at most one unit of stopped work there (Demand.job_size), rooms
    that share an instance one room. (Any of it there excused every stop in its room: one g5.xlarge bought for t1's
    high job in the slots of two deleted instances excused the stops of t1's low jobs on both, one of them for t2's new
    job: fleet114.)"""
    units: dict[str, int] = {}
    stops_of: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
    for job, ran_on in stops:
        stops_of.setdefault(demand_of[job].tenant, []).append((job, ran_on))
    for t, mine_stops in sorted(stops_of.items()):
        mine = by_tenant.get(t)
        lowest = min(demand_of[job].klass for job, _ in mine_stops)
        higher = [(c, j) for c, j in mine.arriving if c > lowest] if mine else []
        if not higher:
            continue
        rooms = {job: _room(ran_on, mine, observed, rebought) for job, ran_on in mine_stops}
        in_room = [job for job, _ in mine_stops
                   if any(c > demand_of[job].klass and rooms[job].intersection(j.instances) for c, j in higher)]
        units |= _stood_in_by_units(in_room, rooms, higher, demand_of, problem, t)
        for job, _ in mine_stops:
            d = demand_of[job]
            if units.get(job, 0) >= d.job_size:
                continue
            if _guarantee_full_without(d, mine, [j for c, j in higher if c > d.klass], demand_of, problem):
                units[job] = d.job_size
    return units


def _room(ran_on, mine: TenantMoves, observed: Observed, rebought: dict[str, tuple[str, ...]]) -> set[str]:
    """A stopped job's room (`own_higher_class_room`): the instances it ran on, the slots bought again of those the plan
    deletes, and where its tenant's jobs moved into that room ran (and so on)."""
    room = set(ran_on)
    grown = True
    while grown:  # (the tenant's jobs moved into the room left room where they ran)
        grown = False
        room.update(r for i in list(room) for r in rebought.get(i, ()))
        for j in mine.moves:
            if room.intersection(j.instances) and not room.issuperset(observed.placements.get(j.job, ())):
                room.update(observed.placements.get(j.job, ()))
                grown = True
    return room


def _stood_in_by_units(jobs: list[str], rooms: dict[str, set[str]], higher: list, demand_of: dict[str, Demand], problem: Problem,
                       t: str) -> dict[str, int]:
    """Of tenant t's stopped `jobs`, the units its higher arriving work (`higher`: (class, JobChange)) stands in for, unit
    for unit within their rooms (`own_higher_class_units`). Rooms sharing an instance are one; in each, the highest class
    stopped is served first (what stands in for it stands in for any lower class too), then the smallest job; whole jobs
    first, then what is left there stands in for part of one (a unit kept of the guarantee, no job's stop excused)."""
    parent = Partition()
    find = parent.find
    for job in jobs:
        first = min(rooms[job])
        for i in rooms[job]:
            parent.union(i, first)
    protected = set(problem.tenants[t].protected_jobs) if t in problem.tenants else set()
    lower = [q for q in problem.demands if q.tenant == t and any(j in protected for j, _ in q.running)]
    supply: dict[str, list[list[int]]] = {}  # room -> [class, units left] of the higher work placed in it
    for c, j in higher:
        q = demand_of[j.job]
        per_room = Counter(find(i) for i in j.instances if i in parent)
        for r, entries in sorted(per_room.items()):
            supply.setdefault(r, []).append([c, entries // q.bundle * stand_in_item_units(q, lower)])
    out: dict[str, int] = {}
    order = sorted(jobs, key=lambda j: (-demand_of[j].klass, demand_of[j].job_size, j))
    for whole in (True, False):
        for job in order:
            d = demand_of[job]
            there = [s for s in supply.get(find(next(iter(rooms[job]))), []) if s[0] > d.klass]
            need = d.job_size - out.get(job, 0)
            if not need or whole and sum(s[1] for s in there) < need:
                continue
            for s in there:
                used = min(need, s[1])
                s[1] -= used
                need -= used
            if d.job_size - need:
                out[job] = d.job_size - need
    return out


def _guarantee_full_without(d: Demand, mine: TenantMoves, higher: list, demand_of: dict[str, Demand], problem: Problem) -> bool:
    """Whether d's tenant's guarantee is full without its stopped job (`own_higher_class_room`): its kept work and its
    `higher` arriving work leave no guaranteed room for it: the job would borrow, and borrowed room goes back."""
    rules = problem.tenants.get(d.tenant)
    if rules is None or not rules.guarantee:
        return False  # (nothing bounds its guaranteed room: the job fits beside what the tenant runs)
    # (what it keeps or moves, the higher work that arrives new, and the job: kept or moved arriving work is in the first)
    use = {k: d.req(k) * d.replicas + mine.kept_use[k] for k in DIMS}
    for j in higher:
        if j.action not in ("keep", "move"):
            q = demand_of[j.job]
            for k in DIMS:
                use[k] += q.req(k) * q.replicas
    return borrows({k: v for k, v in use.items() if d.req(k)}, rules)  # (in a dimension it asks for: it would borrow there)


_UNITS = {"gpus": "GPUs", "cpu": "vCPUs", "memory_gib": "GiB of memory"}


def _ledgers(plan: Plan, problem: Problem, creates: list[CreateAction], staying: set[str]):
    """The one ledger (reconciler/ledger.py) of the fleet the plan leaves, and of the fleet as it runs."""
    demand_of = {j: d for d in problem.demands for j in d.jobs}
    ours = [j for j in plan.jobs if j.action in ("keep", "place", "move") and j.job in demand_of]
    if any(len(j.instances) != demand_of[j.job].replicas * demand_of[j.job].bundle for j in ours):
        return None
    after = plan_ledger(problem, creates, sorted(staying), [(j.job, j.instances) for j in ours])
    return after, running_ledger(problem)  # (the problem's running jobs are the observed placements of its jobs)


def _tenant_errors(problem: Problem, after, before) -> list[str]:
    """Tenants the plan takes past a ceiling or a budget. A tenant already past one in the snapshot (a quota just
    lowered) is refused only if the plan gives it more."""
    errors: list[str] = []
    for name, rules in sorted(problem.tenants.items()):
        use, was = after.tenant_use(name), before.tenant_use(name)
        for dim, cap in sorted(rules.cap.items()):
            if not quota_ok(use.get(dim, 0.0), 0.0, cap) and use.get(dim, 0.0) > was.get(dim, 0.0) + 1e-9:
                errors.append(f"tenant {name}: the plan gives it {amount(use[dim], _UNITS.get(dim, dim))}, over its ceiling of "
                              f"{amount(cap, _UNITS.get(dim, dim))} (quota, or burst where it may borrow)")
        if rules.budget is not None:
            pay = after.tenant_spend(name)
            if not budget_ok(pay, rules.budget) and pay > before.tenant_spend(name):
                errors.append(f"tenant {name}: the plan charges it {money(after.tenant_charge(name))}/h, over its budget of "
                              f"{money(rules.budget)}/h")
    return errors


def _replica_need(d: Demand, dim: str) -> float:
    """What one replica of d takes of dim (an item of a same-instance gang is `bundle` replicas)."""
    return d.req(dim) / d.bundle


def _whole_gpus(d: Demand, cap: Capacity) -> int:
    """GPU indices one replica of d holds on cap: whole GPUs only (MIG slices are not indexed)."""
    return 0 if d.mig or cap.mig else d.gpus // d.bundle


def _fit_errors(plan: Plan, observed: Observed, problem: Problem, created: dict[str, Capacity], staying: set[str]) -> list[str]:
    """Each job's action against the snapshot, and what each instance will host against the instance."""
    errors: list[str] = []
    demand_of = {j: d for d in problem.demands for j in d.jobs}
    hosts = {c.instance_id: c for c in problem.hosts()}
    recorded = observed.gpu_indices
    placed: dict[str, list[tuple[str, int, tuple[int, ...]]]] = {}  # target -> (job, replica, GPU indices)
    for j in plan.jobs:
        d = demand_of.get(j.job)
        if d is None:
            continue
        if j.action == "evict" and not j.previous:
            errors.append(f"job {j.job}: evict, but it does not run")
        if j.action == "pending" and j.previous:
            errors.append(f"job {j.job}: pending, but it runs on {', '.join(j.previous)}: stopping running work is an evict")
        if j.action not in ("keep", "place", "move"):
            continue
        want = d.replicas * d.bundle
        if len(j.instances) != want:
            errors.append(f"job {j.job}: {j.action} of {amount(len(j.instances), 'replicas')}; the job has {amount(want, 'replicas')}")
            continue
        if j.action == "keep" and sorted(j.instances) != sorted(j.previous):
            errors.append(f"job {j.job}: keep, but on {list(j.instances)}, not where it runs ({list(j.previous)})")
        rec = recorded.get(j.job)
        if j.action == "keep" and j.gpus and rec and len(rec) == len(j.previous) and \
                sorted(zip(j.instances, map(tuple, j.gpus))) != sorted(zip(j.previous, map(tuple, rec))):
            # A keep restarts nothing: the replica goes on holding the GPUs it holds, whatever the plan writes (audit: a
            # keep relabelled to GPU 7 and a new job given GPU 1, which the kept job held: two jobs on one GPU).
            errors.append(f"job {j.job}: keep, but on GPUs {[list(g) for g in j.gpus]}, not the GPUs it runs on "
                          f"({[list(g) for g in rec]})")
        if (j.action == "move") != bool(j.previous) and j.action != "keep":
            errors.append(f"job {j.job}: {j.action}, but it " + ("does not run" if j.action == "move" else f"runs on {list(j.previous)}"))
        if j.gpus and len(j.gpus) != want:
            errors.append(f"job {j.job}: GPU indices for {amount(len(j.gpus), 'replicas')}; the job has {amount(want, 'replicas')}")
            continue
        for r, target in enumerate(j.instances):
            placed.setdefault(target, []).append((j.job, r, tuple(j.gpus[r]) if j.gpus else ()))

    def as_running(job: str, r: int, target: str) -> tuple[int, ...] | None:
        rec = recorded.get(job)
        if rec and r < len(rec):
            return tuple(rec[r])
        return () if not _whole_gpus(demand_of[job], hosts[target]) else None  # not recorded: judged anew

    for target, reps in sorted(placed.items()):
        cap = created.get(target) or (hosts.get(target) if target in staying else None)
        if cap is None:
            continue  # neither stays nor is created: refused above
        if target in hosts:
            now = sorted((job, as_running(job, r, target)) for job, ids in observed.placements.items() if job in demand_of
                         for r, iid in enumerate(ids) if iid == target)
            if sorted((job, g) for job, _, g in reps) == now:
                continue  # the plan leaves this instance's work exactly as it runs
        errors += _instance_errors(target, cap, reps, demand_of, observed)
    return errors


def _instance_errors(target: str, cap: Capacity, reps: list[tuple[str, int, tuple[int, ...]]], demand_of: dict[str, Demand],
                     observed: Observed) -> list[str]:
    errors: list[str] = []
    where = f"{target} ({cap.market} {cap.instance_type} in {cap.zone})"
    was = {job: sum(iid == target for iid in observed.placements.get(job, ())) for job, _, _ in reps}
    arriving = {job for job in was if sum(j == job for j, _, _ in reps) > was[job]}
    for job in sorted(arriving):
        why = cap.keep_blocker if isinstance(cap, Host) and cap.keep_blocker else placement_refusal(demand_of[job], cap)
        if why:
            errors.append(f"job {job} onto {where}: {why}")
    dims = list(DIMS) + sorted({f"mig:{p}" for p in cap.mig or ()})
    for dim in dims + sorted({k for job, _, _ in reps for k in demand_of[job].dims if k not in dims}):
        used = sum(_replica_need(demand_of[job], dim) for job, _, _ in reps)
        if used > cap.cap(dim) + 1e-9:
            unit = _UNITS.get(dim, f"MIG {dim[4:]} slices")
            errors.append(f"{where}: the plan puts {amount(used, unit)} on it, it has {amount(cap.cap(dim), unit)} "
                          f"({', '.join(sorted({job for job, _, _ in reps if _replica_need(demand_of[job], dim)}))})")
    owner: dict[int, tuple[str, int]] = {}
    for job, r, gpus in sorted(reps):
        n = _whole_gpus(demand_of[job], cap)
        if len(gpus) != n or len(set(gpus)) != n or any(not 0 <= g < cap.gpus for g in gpus):
            errors.append(f"job {job} replica {r} on {where}: GPU indices {list(gpus)} are not {amount(n, 'distinct GPUs')} of "
                          f"the {amount(0 if cap.mig else cap.gpus, 'GPUs')} it has (0..{max(0, cap.gpus - 1)})")
            continue
        for g in gpus:
            if g in owner:
                errors.append(f"job {job} replica {r} on {where}: GPU {g} is also given to job {owner[g][0]} replica "
                              f"{owner[g][1]} (GPU overcommit)")
            owner.setdefault(g, (job, r))
    return errors


__all__ = ["KeptInstead", "pool_min_errors", "recheck", "unlawful_evictions"]
