"""Prometheus/OpenMetrics export of a FleetView (reconciler/fleetview.py), with the standard client library.

Three ways out, one set of metrics:
- `reconcile metrics DIR`: the text exposition for node_exporter's textfile collector (`--out` writes it
  atomically, as that collector requires);
- `status/metrics.prom`, written by every apply next to the other status files;
- `serve(port, source)`: a /metrics endpoint for a long-running process (the controller), where `source()`
  returns the FleetView to export at each scrape. Scrapers that ask for OpenMetrics get it.
Every metric carries the `fleet` label (the Topology's name). The names are listed in METRICS, which the
Grafana dashboard in examples/grafana/ is checked against."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from reconciler.atomicfile import write_atomic
from reconciler.errors import ReconcileError
from reconciler.fleetview import COUNTED, REASON_KINDS, FleetView, reason_kind

METRICS: dict[str, str] = {
    "fleetops_gpus": "GPUs on the fleet's instances, per pool and GPU type",
    "fleetops_gpus_allocated": "GPUs holding a job replica (MIG: GPUs its compute slices fill, 7 per GPU, rounded up), per pool and GPU type",
    "fleetops_gpus_idle": "GPUs holding no replica, per pool and GPU type",
    "fleetops_gpu_utilization_ratio": "Allocated GPUs over all GPUs of the fleet (0 without GPUs)",
    "fleetops_instances": "Instances per cloud, zone, market and pool",
    "fleetops_cost_dollars_per_hour": "USD per hour of the fleet's instances",
    "fleetops_tenant_cost_dollars_per_hour": "USD per hour charged to each tenant (the share of its instances its replicas use)",
    "fleetops_pool_cost_dollars_per_hour": "USD per hour of each pool's instances",
    "fleetops_tenant_license_cost_dollars_per_hour": "USD per hour of the floating licenses each tenant's running jobs hold",
    "fleetops_jobs": "Jobs per phase (running, starting, unknown, reserved, pending, evicted, succeeded, failed) and tenant",
    "fleetops_pending_jobs": "Jobs waiting for capacity (pending or evicted; not finished ones), per reason category",
    "fleetops_queue_wait_seconds_avg": "Average time pending jobs have waited since spec.submitted",
    "fleetops_queue_wait_seconds_p95": "95th percentile (nearest rank) of pending jobs' wait since spec.submitted",
    "fleetops_preemptions": "Jobs the last plan evicts (preempted by higher-priority work or a lost guarantee)",
    "fleetops_instances_lost": "Instances the last observe found gone (spot interruptions, lost hosts)",
    "fleetops_tenant_over_quota": "1 if the tenant uses more than its quota allows on some dimension",
    "fleetops_plan_duration_seconds": "Solver time of the last plan",
    "fleetops_solver_gap_ratio": "Cost gap of the last plan to the LP bound (0: optimal; absent where the plan claims none)",
    "fleetops_plan_changes_outstanding": "Creates and deletes the fleet still needs (planned, failed or not started)",
}


def families(view: FleetView) -> list[GaugeMetricFamily]:
    """The metric families of one view (every sample labelled with the fleet)."""
    fam = {name: GaugeMetricFamily(name, doc, labels=["fleet", *_labels(name)]) for name, doc in METRICS.items()}
    f = view.fleet

    gpus: dict[tuple[str, str], list[int]] = {}
    for h in view.hosts:
        if h.gpus:
            acc = gpus.setdefault((h.pool, h.gpu_type or "-"), [0, 0])
            acc[0] += h.gpus
            acc[1] += h.gpus_allocated
    for (pool, gtype), (total, used) in sorted(gpus.items()):
        fam["fleetops_gpus"].add_metric([f, pool, gtype], total)
        fam["fleetops_gpus_allocated"].add_metric([f, pool, gtype], used)
        fam["fleetops_gpus_idle"].add_metric([f, pool, gtype], total - used)
    total = sum(t for t, _ in gpus.values())
    fam["fleetops_gpu_utilization_ratio"].add_metric([f], sum(u for _, u in gpus.values()) / total if total else 0.0)

    inst: dict[tuple[str, str, str, str], int] = {}
    for h in view.hosts:
        k = (h.cloud, h.zone, h.market, h.pool)
        inst[k] = inst.get(k, 0) + 1
    for k, n in sorted(inst.items()):
        fam["fleetops_instances"].add_metric([f, *k], n)
    fam["fleetops_cost_dollars_per_hour"].add_metric([f], round(view.cost, 6))
    for t, c in sorted(view.tenant_cost.items()):
        fam["fleetops_tenant_cost_dollars_per_hour"].add_metric([f, t], round(c, 6))
    for t in sorted(view.tenant_cost):
        fam["fleetops_tenant_license_cost_dollars_per_hour"].add_metric([f, t], round(view.tenant_license_cost.get(t, 0.0), 6))
    for p, c in sorted(view.pool_cost.items()):
        fam["fleetops_pool_cost_dollars_per_hour"].add_metric([f, p], round(c, 6))

    phases: dict[tuple[str, str], int] = {}
    for t in view.tenant_cost:
        for ph in (*COUNTED, "evicted"):  # (evicted: waiting, stopped by the plan, which fleet.yaml counts pending)
            phases[(ph, t)] = 0
    reasons: dict[str, int] = {kind: 0 for _, kind in REASON_KINDS} | {"other": 0}  # a zero, not "no data"
    for j in view.jobs:
        phases[(j.phase, j.tenant)] = phases.get((j.phase, j.tenant), 0) + 1
        if j.waiting:
            k = reason_kind(j.reason)
            reasons[k] = reasons.get(k, 0) + 1
    for (ph, t), n in sorted(phases.items()):
        fam["fleetops_jobs"].add_metric([f, ph, t], n)
    for k, n in sorted(reasons.items()):
        fam["fleetops_pending_jobs"].add_metric([f, k], n)
    avg, p95 = view.wait_stats()
    fam["fleetops_queue_wait_seconds_avg"].add_metric([f], round(avg, 3))
    fam["fleetops_queue_wait_seconds_p95"].add_metric([f], round(p95, 3))
    fam["fleetops_preemptions"].add_metric([f], view.evictions)
    fam["fleetops_instances_lost"].add_metric([f], view.instances_lost)
    for t, over in sorted(view.over_quota.items()):
        fam["fleetops_tenant_over_quota"].add_metric([f, t], 1 if over else 0)
    fam["fleetops_plan_duration_seconds"].add_metric([f], round(view.plan_seconds, 3))
    if view.solver_gap is not None:  # (no sample where the plan claims no gap: plan.quality.claimed_gap)
        fam["fleetops_solver_gap_ratio"].add_metric([f], 0.0 if view.solver_optimal else round(max(0.0, view.solver_gap), 6))
    fam["fleetops_plan_changes_outstanding"].add_metric([f], view.changes_outstanding)
    return list(fam.values())


def _labels(name: str) -> list[str]:
    return {
        "fleetops_gpus": ["pool", "gpu_type"], "fleetops_gpus_allocated": ["pool", "gpu_type"],
        "fleetops_gpus_idle": ["pool", "gpu_type"], "fleetops_instances": ["cloud", "zone", "market", "pool"],
        "fleetops_tenant_cost_dollars_per_hour": ["tenant"], "fleetops_pool_cost_dollars_per_hour": ["pool"],
        "fleetops_tenant_license_cost_dollars_per_hour": ["tenant"],
        "fleetops_jobs": ["phase", "tenant"], "fleetops_pending_jobs": ["reason"], "fleetops_tenant_over_quota": ["tenant"],
    }.get(name, [])


class _ViewCollector:
    def __init__(self, source: Callable[[], FleetView | None]):
        self.source = source

    def collect(self):
        view = self.source()
        if view is not None:  # nothing to export yet (a controller before its first plan): an empty scrape
            yield from families(view)


def registry_for(source: Callable[[], FleetView | None]) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_ViewCollector(source))  # type: ignore[arg-type]
    return reg


def exposition(view: FleetView, openmetrics: bool = False) -> str:
    """The text node_exporter's textfile collector reads (Prometheus format), or OpenMetrics."""
    reg = registry_for(lambda: view)
    return (generate_openmetrics(reg) if openmetrics else generate_latest(reg)).decode()


def write_textfile(path: Path, view: FleetView) -> None:
    """`reconcile metrics --out PATH`: atomically (write, then rename), so the textfile collector never reads half a
    file, through reconciler.atomicfile (nothing planted in that directory is written through; the temporary file is
    removed when a step fails). (status/metrics.prom,
    inside the config repo, goes through reconciler.statusfiles.StatusFiles instead, as every status file does.)"""
    path = Path(path)
    text = exposition(view).encode()
    if path.is_dir():
        raise ReconcileError(f"{path} is a directory: --out names the file to write (e.g. {path / 'fleetops.prom'})")
    try:
        write_atomic(path, text)
    except OSError as e:
        raise ReconcileError(f"cannot write {path}: {e.strerror or e}") from None


def serve(port: int, source: Callable[[], FleetView | None], addr: str = "127.0.0.1"):
    """Serve /metrics on addr:port (0: a free port) from a daemon thread; each scrape calls source().
    Returns the server (its .server_port is the port; .shutdown() stops it). For `reconcile controller`."""
    from prometheus_client import start_http_server

    server, _thread = start_http_server(port, addr=addr, registry=registry_for(source))
    return server


__all__ = ["METRICS", "exposition", "families", "registry_for", "serve", "write_textfile"]
