"""Write status back into the config repo: status/jobs/*.yaml, status/pools/*.yaml, status/fleet.yaml.

Conditions follow the Kubernetes convention (type, status, reason, message,
lastTransitionTime); a condition's time changes only when its status does, so
status commits stay quiet when nothing happened."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from providers.base import Instance
from providers.catalog import load_catalog
from reconciler.apply import ApplyReport
from reconciler.ledger import replica_charge
from reconciler.model import API_VERSION, DesiredState
from reconciler.plan import Plan
from reconciler.state import utcnow


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str


def _conditions(path: Path, new: list[Condition], now: str) -> list[dict]:
    old = {}
    if path.exists():
        try:
            old = {c["type"]: c for c in (yaml.safe_load(path.read_text()) or {}).get("status", {}).get("conditions", [])}
        except (yaml.YAMLError, AttributeError, TypeError):
            old = {}
    out = []
    for c in new:
        prev = old.get(c.type)
        status = "True" if c.status else "False"
        since = prev["lastTransitionTime"] if prev and prev.get("status") == status else now
        out.append({"type": c.type, "status": status, "reason": c.reason, "message": c.message, "lastTransitionTime": since})
    return out


def _write(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(doc, sort_keys=False)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def write_status(config_dir: Path, desired: DesiredState, plan: Plan, report: ApplyReport, instances: list[Instance],
                 runtime=None) -> Path:
    """Status after an apply. `instances` is the fleet as observed after it; `runtime` what the
    node agents reported (reconciler.runtime.lifecycle.RuntimeView) for jobs that run something."""
    root = Path(config_dir) / "status"
    now = utcnow().isoformat()
    catalog = load_catalog()
    by_id = {i.id: i for i in instances}
    price = dict(plan.kept)  # existing instances kept, at the plan's prices
    for ref, iid in report.created.items():
        price[iid] = next(c.price for c in plan.creates if c.ref == ref)

    def inst_price(iid: str) -> float:
        if iid in price:
            return price[iid]
        i = by_id.get(iid)
        off = catalog.offering(i.cloud, i.region, i.zone, i.instance_type) if i else None
        if off is None:
            return 0.0
        return off.spot_price if i.market == "spot" and off.spot_price is not None else off.on_demand_price

    changes = {j.job: j for j in plan.jobs}
    tenant_cost: dict[str, float] = {t: 0.0 for t in desired.tenants}
    seen_jobs = set()
    for name, job in desired.jobs.items():
        seen_jobs.add(name)
        ids = report.placements.get(name, [])
        ch = changes.get(name)
        cost = 0.0
        for iid in ids:
            inst = by_id.get(iid)
            shape = catalog.shape(inst.cloud, inst.instance_type) if inst else None
            if shape is not None:  # the ledger's charge, as tenant budgets count it (MIG slices too)
                cost += replica_charge(job.spec.resources, shape.gpus, shape.cpu, inst_price(iid))
        tenant_cost[job.spec.tenant] = tenant_cost.get(job.spec.tenant, 0.0) + cost
        run = runtime.jobs.get(name) if runtime is not None else None
        if run is not None and name in runtime.finished and not ids:
            cond = Condition("Placed", False, "Finished", f"{run.phase}: its capacity is released until its spec changes")
        elif ids:
            cond = Condition("Placed", True, "Placed", f"{len(ids)} replica(s) on {', '.join(sorted(set(ids)))}")
        elif ch is not None and ch.action in ("place", "move"):
            cond = Condition("Placed", False, "ProvisioningFailed", "; ".join(report.failed_refs.get(r, "") for r in ch.instances if r in report.failed_refs) or "new capacity could not be created")
        else:
            cond = Condition("Placed", False, "Evicted" if ch and ch.action == "evict" else "Pending", ch.reason if ch else "not in the last plan")
        path = root / "jobs" / f"{name}.yaml"
        conds = [cond] + ([Condition(*c) for c in run.conditions] if run is not None else [])
        body = {
            "phase": run.phase if run is not None else "Running" if ids else "Pending", "tenant": job.spec.tenant, "instances": ids,
            "hourlyCost": round(cost, 4),
            "conditions": _conditions(path, conds, now),
        }
        if run is not None:
            body["run"] = {"reason": run.reason, "message": run.message, "restarts": run.restarts, "startedAt": run.started_at,
                           "finishedAt": run.finished_at, "replicas": list(run.replicas), "lastLog": list(run.log_tail)}
        _write(path, {"apiVersion": API_VERSION, "kind": "JobStatus", "metadata": {"name": name}, "status": body})
    for stale in (root / "jobs").glob("*.yaml") if (root / "jobs").exists() else []:
        if stale.stem not in seen_jobs:
            stale.unlink()

    for name, pool in desired.pools.items():
        mine = sorted((i for i in instances if i.pool == name), key=lambda i: i.id)
        cost = sum(inst_price(i.id) for i in mine)
        lo, hi = pool.spec.min_instances, pool.spec.max_instances
        failed = [report.failed_refs[c.ref] for c in plan.creates if c.pool == name and c.ref in report.failed_refs]
        ok = lo <= len(mine) <= hi and not failed
        msg = f"{len(mine)} instance(s), within [{lo}, {hi}]" if ok else (
            f"{len(failed)} create(s) failed: {failed[0]}" if failed else f"{len(mine)} instance(s), outside [{lo}, {hi}]")
        path = root / "pools" / f"{name}.yaml"
        _write(path, {
            "apiVersion": API_VERSION, "kind": "PoolStatus", "metadata": {"name": name},
            "status": {
                "instances": [{"id": i.id, "type": i.instance_type, "zone": i.zone, "market": i.market} for i in mine],
                "hourlyCost": round(cost, 4),
                "conditions": _conditions(path, [Condition("Provisioned", ok, "Provisioned" if ok else "ProvisioningFailed", msg)], now),
            },
        })
    fleet_cost = sum(inst_price(i.id) for i in instances)
    path = root / "fleet.yaml"
    # The last plan that changed something; a run that changes nothing leaves status untouched.
    last = plan.id
    if not plan.has_changes and report.ok and path.exists():
        try:
            last = (yaml.safe_load(path.read_text()) or {}).get("status", {}).get("lastChangedBy", plan.id)
        except yaml.YAMLError:
            pass
    _write(path, {
        "apiVersion": API_VERSION, "kind": "FleetStatus", "metadata": {"name": desired.fleet},
        "status": {
            "instances": len(instances), "hourlyCost": round(fleet_cost, 4),
            "tenants": {t: {"hourlyCost": round(c, 4)} for t, c in sorted(tenant_cost.items())},
            "jobs": {"running": sum(1 for j in desired.jobs if report.placements.get(j)), "pending": sum(1 for j in desired.jobs if not report.placements.get(j))},
            "lastChangedBy": last, "failures": report.failures,
            "conditions": _conditions(path, [Condition("Converged", report.ok, "Applied" if report.ok else "PartialFailure", "; ".join(report.failures) or "plan applied")], now),
        },
    })
    return root
