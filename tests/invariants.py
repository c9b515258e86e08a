"""Check a plan's answer against the rules, independently of the solver.

Uses only the desired state, the catalog and the plan: if the solver model has
a bug, these checks do not share it."""

from __future__ import annotations

from collections import defaultdict

from providers.catalog import load_catalog
from reconciler.model import DesiredState, region_matches
from reconciler.observe import Observed
from reconciler.plan import Plan


def check_plan(desired: DesiredState, observed: Observed, plan: Plan) -> None:
    cat = load_catalog()
    hosts = {}  # instance id or create ref -> (cloud, region, zone, type, market, pool)
    deleted = {d.instance_id for d in plan.deletes}
    for i in observed.instances:
        if i.id not in deleted:
            hosts[i.id] = (i.cloud, i.region, i.zone, i.instance_type, i.market, i.pool)
    for c in plan.creates:
        hosts[c.ref] = (c.cloud, c.region, c.zone, c.instance_type, c.market, c.pool)
    used = defaultdict(lambda: [0, 0.0, 0.0])
    tenant_use = defaultdict(lambda: [0, 0.0, 0.0])
    for jc in plan.jobs:
        spec = desired.jobs[jc.job].spec
        r = spec.resources
        if jc.action in ("pending", "evict"):
            assert jc.instances == (), f"{jc.job} is pending but has instances"
            assert jc.reason, f"{jc.job} is pending without a reason"
            continue
        assert len(jc.instances) == spec.replicas, f"gang {jc.job} not whole: {len(jc.instances)}/{spec.replicas}"
        zones = set()
        for h in jc.instances:
            assert h in hosts, f"{jc.job} placed on {h}, which will not exist"
            cloud, region, zone, itype, market, pool = hosts[h]
            shape = cat.shape(cloud, itype)
            zones.add((cloud, zone))
            if r.gpus or r.mig:
                assert shape.gpu_type == r.gpu_type, f"{jc.job} wants {r.gpu_type}, {h} has {shape.gpu_type}"
            else:
                assert shape.gpus == 0, f"CPU job {jc.job} on GPU instance {h}"
            if spec.spot == "never":
                assert market != "spot", f"spot-never job {jc.job} on spot {h}"
            if spec.spot == "required":
                assert market == "spot", f"spot-required job {jc.job} on {market} {h}"
            assert region_matches(spec.regions, cloud, region), f"{jc.job} outside its regions"
            assert spec.pools is None or pool in spec.pools
            u = used[h]
            u[0] += r.gpus
            u[1] += r.cpu
            u[2] += r.memory_gib
        assert len(zones) == 1, f"gang {jc.job} spans zones {zones}"
        t = tenant_use[spec.tenant]
        t[0] += r.gpus * spec.replicas
        t[1] += r.cpu * spec.replicas
        t[2] += r.memory_gib * spec.replicas
    for h, (g, c, m) in used.items():
        cloud, region, zone, itype, market, pool = hosts[h]
        shape = cat.shape(cloud, itype)
        assert g <= shape.gpus, f"GPU overcommit on {h}: {g}>{shape.gpus}"
        assert c <= shape.cpu + 1e-6, f"CPU overcommit on {h}: {c}>{shape.cpu}"
        assert m <= shape.memory_gib + 1e-6, f"memory overcommit on {h}: {m}>{shape.memory_gib}"
    for tname, (g, c, m) in tenant_use.items():
        q = desired.tenants[tname].spec.quota
        for dim, v in (("gpus", g), ("cpu", c), ("memory_gib", m)):
            cap = q.cap(dim)
            assert cap is None or v <= cap + 1e-6, f"tenant {tname} over quota on {dim}: {v}>{cap}"
    per_pool = defaultdict(int)
    for h, (*_, pool) in hosts.items():
        per_pool[pool] += 1
    for name, p in desired.pools.items():
        assert p.spec.min_instances <= per_pool[name] <= p.spec.max_instances, f"pool {name} has {per_pool[name]} instances"
    g = desired.guardrails
    for h, (cloud, region, *_rest) in hosts.items():
        if h.startswith("+"):
            assert region_matches(g.allowed_regions, cloud, region)
    if g.max_hourly_budget is not None:
        assert plan.cost_after <= g.max_hourly_budget + 1e-6
