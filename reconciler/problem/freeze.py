"""Freezing: on a large fleet, hosts no decision can change are solved as constants, so a drift plan
over 10k instances solves only the part of the fleet that moved."""

from __future__ import annotations

import math

from reconciler.ledger import budget_ok, micro, spot_share_ok
from reconciler.model import DesiredState
from reconciler.problem.rules import OfferFits, Rival, borrowing_tenants, forced_items, has_room, may_preempt, over_cap_tenants, pools_over_max, wants_room
from reconciler.problem.types import DIMS, Capacity, Demand, TenantRules, spot_measure, type_class

FREEZE_ABOVE = 400  # hosts; smaller fleets are always solved whole (exact)


def frozen_hosts(hosts: list[Capacity], offers: list[Capacity], demands: list[Demand], desired: DesiredState,
            tenants: dict[str, TenantRules], pool_bounds: dict[str, tuple[int, int]], gpu_fleet: bool | None = None,
            hopeless: frozenset[str] = frozenset()) -> set[str]:
    """Hosts no decision can change, solved as constants. A host is frozen only when it is
    keepable and full (no compatible item fits in what is free), its residents all fit and
    may stay, no pending work may evict them (`may_preempt`; nor, on any GPU model, its tenant's
    pending higher class where the quota is what it needs), moving them to their cheapest
    capacity would not save (consolidation), and no fleet-wide rule is broken now (pool max,
    budgets, quotas, spot rules). Everything else is solved. Checks are by GPU model, not by
    pool or region, so they err towards solving more. `hopeless`: demands no capacity the fleet could have ever
    hosts (Problem.static_pending): they take no room and no job's place. (On the applied 5k fleet four such jobs of
    a higher class, pinned to regions without a large enough T4 type, kept ~1,100 hosts of their tenants solved.)"""
    by_key = {d.key: d for d in demands}
    # (and running work that must leave where it runs: it needs room as new work does, fleet49)
    forced = forced_items(demands, hosts)
    pending = [d for d in demands if d.key not in hopeless and (wants_room(d) or d.key in forced)]
    # Fleet-wide states that force a look at everything.
    if not budget_ok(sum(micro(h.price) for h in hosts), desired.guardrails.max_hourly_budget):
        return set()
    sp = desired.spot_policy
    _, prim = spot_measure(hosts + offers, gpu_fleet)
    spot_p = sum(prim(h) for h in hosts if h.market == "spot")
    total_p = sum(prim(h) for h in hosts)
    spot_rules = sp.on_demand_buffer_percent > 0 or sp.min_instance_types > 1 or sp.min_zones > 1
    unfrozen_markets = {"spot", "on-demand"} if (spot_rules or not spot_share_ok(spot_p, total_p, sp.max_spot_fraction)) else set()
    over_pools = pools_over_max(hosts, pool_bounds)
    # Tenants over a cap now, or with budgets or spot shares (which tie all their work together).
    hot = over_cap_tenants(demands, tenants) | {t for t, r in tenants.items() if r.budget is not None or r.spot_fraction is not None}
    borrowing = borrowing_tenants(demands, tenants)
    preemption = desired.placement.preemption
    # Per GPU model: the smallest item any demand asks (what "room" means), and who is pending.
    smallest: dict[tuple, dict[str, float]] = {}
    for d in demands:
        if d.key in hopeless:
            continue
        cur = smallest.setdefault(type_class(d), {})
        for k in d.dims:
            cur[k] = min(cur.get(k, math.inf), d.req(k))
    pending_by_type: dict[tuple, set[tuple[str, int]]] = {}
    for d in pending:
        pending_by_type.setdefault(type_class(d), set()).add((d.tenant, d.klass))
    # A higher class takes its tenant's lower job's place on any kind of capacity where the tenant's quota is what
    # it needs: stopping a low H100 job gives a normal T4 job the GPU quota (the applied 5k fleet, a job raised from
    # 1 to 2 T4s at its tenant's quota: the victim with the least time left ran on an H100, whose frozen host the
    # model could not stop, and the plan stopped an L4 job at twice the victims tier's weight). Per tenant, the
    # highest pending class, by each capped dimension it asks.
    quota_rivals: dict[tuple[str, str], int] = {}
    if desired.placement.preemption == "LowerPriority":
        for d in pending:
            for k in tenants[d.tenant].cap if d.tenant in tenants else ():
                if d.req(k) > 0:
                    quota_rivals[(d.tenant, k)] = max(quota_rivals.get((d.tenant, k), -1), d.klass)
    consolidate = desired.placement.consolidation == "WhenUnderutilized"
    slice_price = _slice_prices(demands, offers) if consolidate else {}

    wanted_licenses = {n for d in pending for n, _ in d.licenses}
    fits_on = OfferFits()
    frozen = set()
    for h in hosts:
        if h.keep_blocker is not None or h.pool in over_pools or h.market in unfrozen_markets or not h.residents:
            continue
        res = [(by_key[dk], n) for dk, _, n in h.residents if dk in by_key]
        if len(res) != len(h.residents) or any(fits_on(d, h) == 0 for d, _ in res):
            continue
        if any(d.tenant in hot for d, _ in res):
            continue
        if any(d.gang and d.running_items < d.running_jobs * d.replicas for d, _ in res):
            continue  # a gang that lost a replica is healed around its survivors
        if any(job in by_key[dk].reshaped for dk, job, _ in h.residents):
            continue  # a job whose resources changed restarts
        if any(n in wanted_licenses for d, _ in res for n, _ in d.licenses):
            continue  # pending work waits for a license it holds: preemption may take it
        tc = type_class(h)
        dims = ("gpus", "cpu", "memory_gib", *{f"mig:{p}" for p in h.mig or ()})
        free = {k: h.cap(k) - sum(d.req(k) * n for d, n in res) for k in dims}
        need = smallest.get(tc)
        if need and has_room(free, need):
            continue  # room for more
        rivals = pending_by_type.get(tc, ())
        if any(may_preempt(Rival(t, c), d, borrowing, preemption) for t, c in rivals for d, _ in res):
            continue
        if quota_rivals and any(quota_rivals.get((d.tenant, k), -1) > d.klass for d, _ in res for k in DIMS if d.req(k) > 0):
            continue  # its tenant's higher-class work may take its quota
        if consolidate and sum(slice_price.get(d.key, math.inf) * n for d, n in res) < h.price * 0.97:
            continue  # its work fits more cheaply elsewhere
        frozen.add(h.instance_id)
    return frozen


def _slice_prices(demands: list[Demand], offers: list[Capacity]) -> dict[str, float]:
    """The cheapest $/h per item of each running demand on any offer: what consolidation would pay. One answer
    per demand shape (OfferFits): fit() per running demand and offer was 250k calls, ~40% of building the
    applied 10k-job fleet's problem."""
    by_type: dict[tuple, list[tuple[str, Capacity]]] = {}
    for o in offers:
        by_type.setdefault(type_class(o), []).append((o.offer_key, o))
    fits = OfferFits()
    of_shape: dict[int, float] = {}
    out: dict[str, float] = {}
    for d in demands:
        if d.running:
            shape = fits.shape(d)
            best = of_shape.get(shape)
            if best is None:
                best = math.inf
                for okey, o in by_type.get(type_class(d), []):
                    f = fits.at(d, okey, o)
                    if f:
                        best = min(best, o.price / f)
                of_shape[shape] = best
            out[d.key] = best
    return out
