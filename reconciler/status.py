"""Write status back into the config repo: status/jobs/*.yaml, status/pools/*.yaml, status/fleet.yaml.

Conditions follow the Kubernetes convention (type, status, reason, message,
lastTransitionTime); a condition's time changes only when its status does, so
status commits stay quiet when nothing happened."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from providers.base import TAG_RESERVATION, Instance
from providers.catalog import load_catalog
from reconciler.apply import ApplyReport
from reconciler.errors import ReconcileError, shown
from reconciler.fleetview import COUNTED, count_phase
from providers.redact import redact
from reconciler.ledger import license_charge, replica_charge, reservation_cost
from reconciler.model import API_VERSION, NAME_PATTERN, DesiredState
from reconciler.plan import Plan
from reconciler.state import utcnow
from reconciler.statusfiles import StatusFiles, has_alias, has_non_finite, parse_yaml


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str


def dated_condition(new: tuple[str, bool, str, str], prev, now: str, since: dict | None = None) -> dict:
    """A condition (type, status, reason, message) as a status file has it, dated when its status last changed:
    `prev` (the condition of that type as last written) keeps its time while the status is the same, else the agents'
    reports date the change (`since`, JobRun.since: Running from its last replica's start, Succeeded/Failed from its
    end), else now. Apply's status files and live `reconcile status` both date conditions so."""
    kind, ok, reason, message = new
    status = "True" if ok else "False"
    if isinstance(prev, dict) and prev.get("status") == status and "lastTransitionTime" in prev:
        when = prev["lastTransitionTime"]
    else:
        when = (since or {}).get(kind, now)
    return {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": when}


def _conditions(files: StatusFiles, path: Path, new: list[Condition], now: str, dated: dict | None = None) -> list[dict]:
    """Each condition dated (dated_condition) against the one of its type in the file."""
    body = files.document(path).get("status")
    conditions = body.get("conditions") if isinstance(body, dict) else None
    old = {c["type"]: c for c in conditions if isinstance(c, dict) and "type" in c} if isinstance(conditions, list) else {}
    return [dated_condition((c.type, c.status, c.reason, c.message), old.get(c.type), now, dated) for c in new]


# libyaml's emitter where PyYAML has it: the pure-Python one took 40 s of a 5k-job apply's 248 s (one file per job).
class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    def ignore_aliases(self, data) -> bool:
        return True  # a value written twice is written twice: a status file holds no alias (has_alias)


_DUMPER = _Dumper


def _write(files: StatusFiles, path: Path, doc: dict) -> None:
    files.write(path, redact(yaml.dump(doc, Dumper=_DUMPER, sort_keys=False)))


def write_status(config_dir: Path, desired: DesiredState, plan: Plan, report: ApplyReport, instances: list[Instance],
                 runtime=None, fleet_uid: str = "", state_at: str = "") -> Path:
    """Status after an apply. `instances` is the fleet as observed after it; `runtime` what the
    node agents reported (reconciler.runtime.lifecycle.RuntimeView) for jobs that run something.
    `fleet_uid` and `state_at` (where the state is kept) go in fleet.yaml's metadata: the config repo's record of which
    fleet it is, and where that fleet's state is (reconciler/identity.py)."""
    with StatusFiles(config_dir) as files:
        return _write_status(files, desired, plan, report, instances, runtime, _metadata(desired.fleet, fleet_uid, state_at))


def _metadata(name: str, uid: str, state_at: str) -> dict:
    from reconciler.identity import STATE_AT

    return {"name": name, **({"uid": uid} if uid else {}), **({"annotations": {STATE_AT: state_at}} if uid and state_at else {})}


def record_identity(config_dir: Path, name: str, uid: str, state_at: str) -> None:
    """Put a fleet identity the state has just taken (adopted, or a rename's new uid) into status/fleet.yaml's metadata
    at once, where that file exists: written only at the apply's end, a killed apply left the two disagreeing, which
    the next run refuses (reconciler/identity.py)."""
    with StatusFiles(config_dir) as files:
        path = files.config_dir / "status" / "fleet.yaml"
        doc = files.document(path)
        if doc:
            _write(files, path, {**doc, "metadata": _metadata(name, uid, state_at)})


def _write_status(files: "StatusFiles", desired: DesiredState, plan: Plan, report: ApplyReport, instances: list[Instance],
                  runtime=None, metadata: dict | None = None) -> Path:
    root = files.config_dir / "status"
    now = utcnow().isoformat()
    pricing = _Pricing(plan, report, instances)
    licenses = {n: lic.spec for n, lic in desired.licenses.items()}
    charges = _write_job_statuses(files, root, now, desired, plan, report, pricing, licenses, runtime)
    _write_pool_statuses(files, root, now, desired, plan, report, instances, pricing)
    finished = dict(runtime.finished) if runtime is not None else {}
    phases = {n: r.phase for n, r in runtime.jobs.items()} if runtime is not None else {}
    agents = runtime.agents_status() if runtime is not None else {}
    _write_fleet_status(files, root, now, desired, plan, report, instances, pricing, licenses, charges,
                        metadata or {"name": desired.fleet}, finished, phases, agents)
    return root


def job_counts(phases: dict[str, str]) -> dict[str, int]:
    """fleet.yaml's job counts from each job's status phase: a finished job (Succeeded, or Failed past its restarts)
    is counted as such, never as pending (it demands nothing, so the plan leaves it unplaced); a placed job without
    `run` is reserved, never running (nothing is started for it); one whose agents have not started it is starting."""
    counts = dict.fromkeys(COUNTED, 0)
    for phase in phases.values():
        counts[phase] += 1
    return counts


def job_phase(run, placed: bool, reserved: bool) -> str:
    """A job's status phase: as its agents report it; without their report, Reserved for a placed job without `run`
    (nothing is started for it), else Running or Pending as placed."""
    if run is not None:
        return run.phase
    return ("Reserved" if reserved else "Running") if placed else "Pending"


class _Pricing:
    """What an instance costs an hour: the plan's price for those it kept or created, else the catalog's."""

    def __init__(self, plan: Plan, report: ApplyReport, instances: list[Instance]):
        self.catalog = load_catalog()
        self.by_id = {i.id: i for i in instances}
        self.price = dict(plan.kept)  # existing instances kept, at the plan's prices
        for ref, iid in report.created.items():
            self.price[iid] = next(c.price for c in plan.creates if c.ref == ref)

    def hourly(self, iid: str) -> float:
        if iid in self.price:
            return self.price[iid]
        i = self.by_id.get(iid)
        off = self.catalog.offering(i.cloud, i.region, i.zone, i.instance_type) if i else None
        if off is None:
            return 0.0
        return off.spot_price if i.market == "spot" and off.spot_price is not None else off.on_demand_price


@dataclass
class _Charges:
    """Per tenant, what its placed jobs cost an hour (instances, licenses), and per license, what each tenant holds."""

    tenant_cost: dict[str, float]
    license_cost: dict[str, float]
    held: dict[str, dict[str, int]]  # license -> tenant -> held by running replicas


def _write_job_statuses(files: StatusFiles, root: Path, now: str, desired: DesiredState, plan: Plan, report: ApplyReport,
                        pricing: _Pricing, licenses: dict, runtime) -> _Charges:
    """status/jobs/<job>.yaml for every desired job (the files of jobs no longer desired are removed); the
    charges they add up to, for fleet.yaml."""
    changes = {j.job: j for j in plan.jobs}
    charges = _Charges({t: 0.0 for t in desired.tenants}, {t: 0.0 for t in desired.tenants}, {n: {} for n in licenses})
    seen_jobs = set()
    for name, job in desired.jobs.items():
        seen_jobs.add(name)
        ids = report.placements.get(name, [])
        cost = 0.0
        for iid in ids:
            inst = pricing.by_id.get(iid)
            shape = pricing.catalog.shape(inst.cloud, inst.instance_type) if inst else None
            if shape is not None:  # the ledger's charge, as tenant budgets count it (MIG slices too)
                cost += replica_charge(job.spec.resources, shape.gpus, shape.cpu, pricing.hourly(iid))
        tenant = job.spec.tenant
        charges.tenant_cost[tenant] = charges.tenant_cost.get(tenant, 0.0) + cost
        lic_cost = license_charge(job.spec.licenses, licenses, len(ids))  # license-hours, charged to the tenant
        charges.license_cost[tenant] = charges.license_cost.get(tenant, 0.0) + lic_cost
        for lname, n in job.spec.licenses.items():
            if lname in charges.held and ids:
                charges.held[lname][tenant] = charges.held[lname].get(tenant, 0) + n * len(ids)
        run = runtime.jobs.get(name) if runtime is not None else None
        cond = _placed_condition(name, ids, changes.get(name), run, runtime, report, job.spec.run is None)
        path = root / "jobs" / f"{name}.yaml"
        conds = [cond] + ([Condition(*c) for c in run.conditions] if run is not None else []) + _deadline_conditions(plan, name)
        body = {
            "phase": job_phase(run, bool(ids), job.spec.run is None), "tenant": tenant, "instances": ids,
            "hourlyCost": round(cost, 4),
            **({"licenses": dict(job.spec.licenses), "licenseCostPerHour": round(lic_cost, 4)} if job.spec.licenses else {}),
            "conditions": _conditions(files, path, conds, now, dict(run.since) if run is not None else None),
        }
        if run is not None:
            body["run"] = {"reason": run.reason, "message": run.message, "restarts": run.restarts, "startedAt": run.started_at,
                           "finishedAt": run.finished_at, "replicas": list(run.replicas), "lastLog": list(run.log_tail)}
        _write(files, path, {"apiVersion": API_VERSION, "kind": "JobStatus", "metadata": {"name": name}, "status": body})
    for stale in files.names(root / "jobs"):
        if stale[: -len(".yaml")] not in seen_jobs:
            files.remove(root / "jobs" / stale)
    return charges


def _placed_condition(name: str, ids: list[str], ch, run, runtime, report: ApplyReport, reserved: bool = False) -> Condition:
    """A job's Placed condition: finished (capacity released), placed (reserved: no `run`), its new capacity failed,
    evicted or pending."""
    if run is not None and name in runtime.finished and not ids:
        return Condition("Placed", False, "Finished", f"{run.phase}: its capacity is released until its spec changes")
    if ids and reserved:
        return Condition("Placed", True, "Placed", f"{len(ids)} replica(s) reserved on {', '.join(sorted(set(ids)))}: "
                                                    "nothing is started (the job has no run)")
    if ids:
        return Condition("Placed", True, "Placed", f"{len(ids)} replica(s) on {', '.join(sorted(set(ids)))}")
    if ch is not None and ch.action in ("place", "move"):
        why = "; ".join(report.failed_refs.get(r, "") for r in ch.instances if r in report.failed_refs) or "new capacity could not be created"
        stopped = report.gangs_stopped.get(name)
        if stopped:  # (it did run, partly: say why it no longer does)
            why += (f"; a gang runs with all its replicas or none: its surviving replica(s) on {', '.join(stopped)} were "
                    "stopped, and the next run places it whole")
        return Condition("Placed", False, "ProvisioningFailed", why)
    return Condition("Placed", False, "Evicted" if ch and ch.action == "evict" else "Pending", ch.reason if ch else "not in the last plan")


def _write_pool_statuses(files: StatusFiles, root: Path, now: str, desired: DesiredState, plan: Plan, report: ApplyReport,
                         instances: list[Instance], pricing: _Pricing) -> None:
    """status/pools/<pool>.yaml: its instances, their cost, and whether it is within its bounds with no create failed."""
    for name, pool in desired.pools.items():
        mine = sorted((i for i in instances if i.pool == name), key=lambda i: i.id)
        cost = sum(pricing.hourly(i.id) for i in mine)
        lo, hi = pool.spec.min_instances, pool.spec.max_instances
        failed = [report.failed_refs[c.ref] for c in plan.creates if c.site.pool == name and c.ref in report.failed_refs]
        ok = lo <= len(mine) <= hi and not failed
        msg = f"{len(mine)} instance(s), within [{lo}, {hi}]" if ok else (
            f"{len(failed)} create(s) failed: {failed[0]}" if failed else f"{len(mine)} instance(s), outside [{lo}, {hi}]")
        path = root / "pools" / f"{name}.yaml"
        _write(files, path, {
            "apiVersion": API_VERSION, "kind": "PoolStatus", "metadata": {"name": name},
            "status": {
                "instances": [{"id": i.id, "type": i.instance_type, "zone": i.zone, "market": i.market} for i in mine],
                "hourlyCost": round(cost, 4),
                "conditions": _conditions(files, path, [Condition("Provisioned", ok, "Provisioned" if ok else "ProvisioningFailed", msg)], now),
            },
        })


def _write_fleet_status(files: StatusFiles, root: Path, now: str, desired: DesiredState, plan: Plan, report: ApplyReport,
                        instances: list[Instance], pricing: _Pricing, licenses: dict, charges: _Charges, metadata: dict,
                        finished: dict[str, str], phases: dict[str, str], agents: dict[str, dict[str, str]]) -> None:
    """status/fleet.yaml: the fleet's cost, per tenant and license, reservations, job counts, the last plan that changed it,
    and what is wrong with the agents that beat (`agents`, as `reconcile status` shows them: RuntimeView.agents_status)."""
    fleet_cost = sum(pricing.hourly(i.id) for i in instances)
    path = root / "fleet.yaml"
    # The last plan that changed something; a run that changes nothing leaves status untouched.
    last = plan.id
    if not plan.has_changes and report.ok:
        old = files.document(path).get("status")
        last = old.get("lastChangedBy", plan.id) if isinstance(old, dict) else plan.id
    held = charges.held
    _write(files, path, {
        "apiVersion": API_VERSION, "kind": "FleetStatus", "metadata": metadata,
        "status": {
            "instances": len(instances), "hourlyCost": round(fleet_cost, 4),
            "tenants": {t: {"hourlyCost": round(c, 4), **({"licenseCostPerHour": round(charges.license_cost.get(t, 0.0), 4)} if licenses else {})}
                        for t, c in sorted(charges.tenant_cost.items())},
            **({"licenses": {n: {"count": spec.count, "held": sum(held[n].values()), "tenants": dict(sorted(held[n].items()))}
                             for n, spec in sorted(licenses.items())}} if licenses else {}),
            **({"reservations": _reservation_status(desired, instances)} if desired.reservations else {}),
            "jobs": job_counts({n: count_phase(bool(report.placements.get(n)), finished.get(n), j.spec.run is None,
                                               phases.get(n)) for n, j in desired.jobs.items()}),
            "lastChangedBy": last, "failures": report.failures,
            **({"agents": agents} if agents else {}),
            "conditions": _conditions(files, path, [Condition("Converged", report.ok, "Applied" if report.ok else "PartialFailure", "; ".join(report.failures) or "plan applied")], now),
        },
    })


def _deadline_conditions(plan: Plan, job: str) -> list[Condition]:
    """DeadlineAtRisk and DeadlineMissed of a job with a deadline, as the plan found them."""
    dl = plan.rules.get("deadlines", {}).get(job)
    if dl is None:
        return []
    return [Condition(kind, dl["condition"] == kind, dl["condition"], dl["message"]) for kind in ("DeadlineAtRisk", "DeadlineMissed")]


def _reservation_status(desired: DesiredState, instances: list[Instance]) -> dict:
    """Per Reservation: its instances running now (by their tag, up to its count), utilisation, what
    it commits per hour and what its unused reserved instances waste per hour."""
    out = {}
    for name, r in sorted(desired.reservations.items()):
        s = r.spec
        used = sum(1 for i in instances if i.tags.get(TAG_RESERVATION) == name and i.zone == s.zone
                   and i.instance_type == s.instance_type and i.state != "terminated")
        util, committed, wasted = reservation_cost(s.count, used, s.hourly_cost)
        out[name] = {"count": s.count, "used": min(used, s.count), "utilisation": util, "committedPerHour": committed, "wastedPerHour": wasted}
    return out


def _status_problem(kind: str, doc) -> str | None:
    """What `reconcile status` needs from a status file and this one lacks, if anything."""
    if has_alias(doc):
        return "it holds a YAML alias (a value named twice: &anchor ... *anchor), which apply never writes"
    if has_non_finite(doc):
        return "it holds .nan or .inf, a number apply never writes"
    body = doc.get("status") if isinstance(doc, dict) else None
    if not isinstance(body, dict):
        return "it is not a status document (no status mapping)"
    if kind == "fleet":
        need = {"instances": (int,), "hourlyCost": (int, float), "jobs": (dict,), "tenants": (dict,), "lastChangedBy": (str,)}
        if not isinstance(doc.get("metadata"), dict) or "name" not in doc["metadata"]:
            return "metadata.name is missing"
    else:
        need = {"conditions": (list,)} if kind == "pools" else {"conditions": (list,), "phase": (str,)}
    for key, types in need.items():
        if not isinstance(body.get(key), types):
            return f"status.{key} is missing or of the wrong type"
    if kind == "fleet" and not all(isinstance(body["jobs"].get(k), int) for k in ("running", "pending")):
        return "status.jobs.running/pending are missing"
    if kind == "fleet" and not all(isinstance(t, dict) and isinstance(t.get("hourlyCost"), (int, float)) for t in body["tenants"].values()):
        return "status.tenants.*.hourlyCost is missing"
    agents = body.get("agents", {}) if kind == "fleet" else {}
    if not (isinstance(agents, dict) and all(isinstance(i, str) and isinstance(a, dict) and isinstance(a.get("reason"), str)
                                             and isinstance(a.get("message"), str) for i, a in agents.items())):
        return "status.agents is not a mapping of instances to a reason and a message"
    if kind == "jobs" and not (body["conditions"] and all(isinstance(c, dict) and {"reason", "message"} <= set(c) for c in body["conditions"])):
        return "status.conditions has no condition with a reason and a message"
    return None


def read_status(config_dir: Path) -> dict:
    """The status files as one document: fleet summary, pools, jobs. A file that cannot be read
    (not YAML, wrong shape, a symlink, a directory) is an error naming it, never a traceback."""
    if not Path(config_dir).is_dir():
        what = "is a file, not a directory" if Path(config_dir).exists() else "does not exist"
        raise ReconcileError(f"config directory {config_dir} {what}")
    out: dict = {"fleet": None, "pools": {}, "jobs": {}, "agents": {}}  # agents: what is wrong with those that beat (live)
    with StatusFiles(config_dir) as files:
        root = files.config_dir / "status"
        wanted = [("fleet", "fleet", root / "fleet.yaml")] + [
            (kind, name[: -len(".yaml")], root / kind / name) for kind in ("pools", "jobs") for name in files.names(root / kind)]
        for kind, name, path in wanted:
            text = files.read(path)
            if text is None:
                continue
            try:
                doc = parse_yaml(text)
                problem = _status_problem(kind, doc)
            except yaml.YAMLError as e:
                mark = getattr(e, "problem_mark", None)
                problem = f"not valid YAML{f' (line {mark.line + 1})' if mark else ''}"
            if kind != "fleet" and not re.fullmatch(NAME_PATTERN, name):  # (it is shown: a newline in it forged a line)
                problem = f"its name is no {kind[:-1]}'s (apply writes status/{kind}/NAME.yaml, NAME a {kind[:-1]}'s)"
            if problem:
                raise ReconcileError(f"{shown(str(path), 4096)}: cannot read this status file: {problem}. status/ is written by "
                                     "`reconcile apply`: delete the file (or restore it from git) and run apply again to rewrite it.")
            if kind == "fleet":
                out["fleet"] = doc
                out["agents"] = doc["status"].get("agents", {})  # (as of the last apply; live status reads them anew)
            else:
                out[kind][name] = doc
    return out
