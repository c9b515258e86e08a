"""`reconcile report DIR --out report.html`: one self-contained HTML page of the fleet (plotly, its JavaScript
inlined: the page opens with no network), drawn from the same FleetView the metrics export.

Plots: GPUs allocated vs idle per pool, $/h per tenant, instances per cloud/zone and market, pending jobs by
reason, and the GPU map of each instance (which replica holds which GPU)."""

from __future__ import annotations

import html
from datetime import datetime

import plotly.graph_objects as go
import plotly.io as pio

from reconciler.fleetview import FleetView, reason_kind

MAP_MAX_HOSTS = 300  # GPU map rows; a bigger fleet's map is cut there (the other plots count every instance)


def _figures(view: FleetView) -> list[tuple[str, object]]:
    out = []
    pools: dict[str, list[int]] = {}
    for h in view.hosts:
        if h.gpus:
            acc = pools.setdefault(h.pool, [0, 0])
            acc[0] += h.gpus_allocated
            acc[1] += h.gpus - h.gpus_allocated
    names = sorted(pools)
    fig = go.Figure([go.Bar(name="allocated", x=names, y=[pools[p][0] for p in names], text=[pools[p][0] for p in names]),
                     go.Bar(name="idle", x=names, y=[pools[p][1] for p in names], text=[pools[p][1] for p in names])])
    fig.update_layout(barmode="stack", title="GPUs allocated vs idle per pool", yaxis_title="GPUs")
    out.append(("gpus-per-pool", fig))

    tenants = sorted(view.tenant_cost)
    cost = [round(view.tenant_cost[t], 2) for t in tenants]
    fig = go.Figure([go.Bar(x=tenants, y=cost, text=[f"${c:,.2f}" for c in cost])])
    fig.update_layout(title=f"$/h per tenant (fleet ${view.cost:,.2f}/h)", yaxis_title="USD per hour")
    out.append(("cost-per-tenant", fig))

    counts: dict[str, dict[str, int]] = {}
    for h in view.hosts:
        m = counts.setdefault(h.market, {})
        m[f"{h.cloud}/{h.zone}"] = m.get(f"{h.cloud}/{h.zone}", 0) + 1
    zones = sorted({z for m in counts.values() for z in m})
    fig = go.Figure([go.Bar(name=market, x=zones, y=[counts[market].get(z, 0) for z in zones], text=[counts[market].get(z, 0) for z in zones])
                     for market in sorted(counts)])
    fig.update_layout(barmode="stack", title="Instances per cloud/zone and market", yaxis_title="instances")
    out.append(("instances-per-zone", fig))

    reasons: dict[str, int] = {}
    for j in view.jobs:
        if j.waiting:
            k = reason_kind(j.reason)
            reasons[k] = reasons.get(k, 0) + 1
    kinds = sorted(reasons)
    fig = go.Figure([go.Bar(x=kinds, y=[reasons[k] for k in kinds], text=[reasons[k] for k in kinds])])
    fig.update_layout(title=f"Pending jobs by reason ({sum(reasons.values())})", yaxis_title="jobs")
    if not reasons:
        fig.add_annotation(text="every job runs", showarrow=False, font={"size": 18})
        fig.update_xaxes(visible=False)
        fig.update_yaxes(visible=False)
    out.append(("pending-by-reason", fig))

    gpu_hosts = [h for h in view.hosts if h.gpus][:MAP_MAX_HOSTS]
    width = max((h.gpus for h in gpu_hosts), default=0)
    z, text, rows = [], [], []
    for h in gpu_hosts:
        holder: dict[int, str] = {}
        for s in h.slots:
            for g in s.gpus:
                holder[g] = f"{holder[g]}+{s.job}/{s.replica}" if g in holder else f"{s.job}/{s.replica}"
        if h.mig:  # MIG slices have no GPU index of their own: the row names the replicas, the cells the GPUs they fill
            holder = {g: "MIG" for g in range(h.gpus_allocated)}
            names = ", ".join(f"{s.job}/{s.replica}" for s in h.slots)
            rows.append(f"{h.id} ({h.instance_type}, MIG: {names[:60] + '...' if len(names) > 60 else names or 'none'})")
        else:
            rows.append(f"{h.id} ({h.instance_type})")
        z.append([None if g >= h.gpus else (1 if g in holder else 0) for g in range(width)])
        text.append(["" if g >= h.gpus else holder.get(g, "idle") for g in range(width)])
    fig = go.Figure(go.Heatmap(z=z, x=[f"GPU {g}" for g in range(width)], y=rows,
                               text=text, texttemplate="%{text}", hovertemplate="%{y} %{x}: %{text}<extra></extra>",
                               colorscale=[[0, "#e8e8e8"], [1, "#4c78a8"]], zmin=0, zmax=1, showscale=False, xgap=2, ygap=2))
    fig.update_layout(title="GPU map: which replica holds which GPU", height=max(300, 28 * len(gpu_hosts) + 120),
                      yaxis={"autorange": "reversed"})
    out.append(("gpu-map", fig))
    return out


def render_report(view: FleetView, generated: datetime) -> str:
    """The whole page; plotly.js is inlined once, so the file needs no network."""
    parts = []
    for i, (div_id, fig) in enumerate(_figures(view)):
        parts.append(f'<section id="{div_id}">' + pio.to_html(fig, include_plotlyjs=(i == 0), full_html=False, div_id=f"plot-{div_id}",
                                                            config={"displaylogo": False, "responsive": True}) + "</section>")
    count = {ph: sum(j.phase == ph for j in view.jobs) for ph in ("running", "starting", "unknown", "reserved")}  # reserved: no `run`
    done = sum(j.phase in ("succeeded", "failed") for j in view.jobs)
    gpus = sum(h.gpus for h in view.hosts)
    used = sum(h.gpus_allocated for h in view.hosts)
    summary = (f"{len(view.hosts)} instances, {gpus} GPUs ({used} allocated), ${view.cost:,.2f}/h; "
               f"{count['running']} jobs running" + "".join(f", {count[ph]} {ph}" for ph in ("starting", "unknown", "reserved") if count[ph])
               + f", {len(view.jobs) - sum(count.values()) - done} not running" + (f", {done} finished" if done else ""))
    cut = sum(1 for h in view.hosts if h.gpus) - MAP_MAX_HOSTS
    note = f"<p>The GPU map shows the first {MAP_MAX_HOSTS} GPU instances of {MAP_MAX_HOSTS + cut}.</p>" if cut > 0 else ""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>fleetops report: {html.escape(view.fleet)}</title>"
            "<style>body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1200px}section{margin-bottom:2em}</style>"
            f"</head><body><h1>fleet {html.escape(view.fleet)}</h1>"
            f"<p id=\"summary\">{html.escape(summary)}; generated {html.escape(generated.isoformat(timespec='seconds'))}</p>"
            f"{note}{''.join(parts)}</body></html>\n")


__all__ = ["render_report"]
