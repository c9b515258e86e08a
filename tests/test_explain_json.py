"""`reconcile explain --format json`: what would change a pending job's fate, as data a tool can read."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from reconciler.cli import app
from tests.fleetkit import doc, job, pool, tenant, topology, write_config

A100 = {"gpus": 1, "gpu_type": "A100", "cpu": 8, "mem": 60}  # one a2-highgpu-1g each, $3.67/h on demand


def test_would_change_and_tried_are_structured(tmp_path):
    """A $8/h tenant budget runs two of three $3.67/h jobs; the third's way out is data: the change, that it then
    runs, and what that costs the fleet per hour (one more job: +$3.67/h)."""
    docs = [topology(), tenant("a"), pool("p", "gcp", "us-central1", ["us-central1-a", "us-central1-b"], ["a2-highgpu-1g"], hi=3),
            doc("GuardrailPolicy", "g", {"tenant_hourly_budgets": {"a": 8.0}})]
    docs += [job(f"j{i}", tenant="a", priority=p, **A100) for i, p in enumerate(["high", "normal", "low"])]
    cfg = write_config(tmp_path / "cfg", docs)
    out = CliRunner().invoke(app, ["explain", str(cfg), "j2", "--format", "json", "--time-limit", "5"])
    assert out.exit_code == 0, out.output
    e = json.loads(out.output)
    assert e["state"] == "pending"
    budget = [w for w in e["would_change"] if w["change"].startswith("raise tenant a's hourly budget")]
    assert budget, e["would_change"]
    w = budget[0]
    assert w["outcome"] == "runs" and w["evicts"] == [] and isinstance(w["fleet_cost_delta_per_hour"], float)
    assert w["fleet_cost_delta_per_hour"] == pytest.approx(3.67, abs=0.01)
    assert w["text"].startswith(w["change"] + ": it would run (+$3.67/h")
    for t in e["tried"]:
        assert t["outcome"] in ("still pending", "refused") and t["reason"] and t["change"]


def test_explain_raises_only_a_limit_that_binds_and_by_at_least_the_shortfall_it_prints(tmp_path):
    """Audit: a job held by the fleet budget was offered "raise max_instances of aws-a100, gcp-a100" though neither pool
    was at its max (aws-a100 0/3), and its pending reason said "$17.06/h more budget" where explain's raise said
    $17.07/h. A pool raise is tried only for a pool at its max_instances, and a shortfall is printed rounded up, as the
    raise that meets it is."""
    import re

    from reconciler import api
    from tests.fleetkit import copy_quickstart

    cfg = copy_quickstart(tmp_path)
    api.apply(cfg, time_limit=5)  # $53.40/h
    kept = api.explain(cfg, "llm-pretrain", time_limit=5)  # no run: a reservation, kept where it is, nothing started
    assert kept.state == "reserved" and kept.summary.startswith("reserved on "), kept.summary
    pol = cfg / "policies.yaml"
    pol.write_text(pol.read_text().replace("max_hourly_budget: 150", "max_hourly_budget: 55"))
    (cfg / "jobs" / "more.yaml").write_text("apiVersion: fleetops.io/v1alpha1\nkind: Job\nmetadata: {name: more}\n"
                                            "spec: {tenant: research, resources: {gpus: 1, gpu_type: A100, cpu: 8, memory_gib: 60}, spot: never}\n")
    ex = api.explain(cfg, "more", time_limit=5)
    assert ex.state == "pending"
    text = " ".join((ex.summary, *ex.details, *ex.would_change, *ex.tried))
    assert "max_hourly_budget" in text, text
    assert "raise max_instances" not in text, text
    said = re.findall(r"would need \$([\d,.]+)/h more budget", text)
    raised = re.findall(r"raise max_hourly_budget by \$([\d,.]+)/h", text)
    assert said and raised and float(raised[0].replace(",", "")) == float(said[0].replace(",", "")), (said, raised)


def test_explain_says_once_what_a_cpu_job_asks(tmp_path):
    """A CPU job's explanation read "asks 1x 8 vCPU, 8 vCPU and 16 GiB per replica" (its vCPU twice: found on the 20k
    reclaim's explain); a GPU job's names its GPUs, then its vCPU and memory."""
    from reconciler import api

    docs = [topology(), tenant("a"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge", "g5.xlarge"], hi=3),
            job("cpu-job", tenant="a", cpu=8, mem=16), job("gpu-job", tenant="a", gpus=1, gpu_type="A10G", cpu=4, mem=16)]
    cfg = write_config(tmp_path / "cfg", docs)
    assert api.explain(cfg, "cpu-job", time_limit=5).details[0].startswith("asks 1x 8 vCPU and 16 GiB per replica; tenant a")
    assert api.explain(cfg, "gpu-job", time_limit=5).details[0].startswith("asks 1x 1 A10G, 4 vCPU and 16 GiB per replica")


def test_explain_names_the_class_an_integer_priority_ranks_in(tmp_path):
    """Integer priorities rank by class (1/10/100/1000 bands): a job of priority 99 waits behind its tenant's running
    normal (10) job, and explain said only "priority 99". It names the class where the integer is not a class's own
    value, and the aged priority's; a class name or value reads as before."""
    from datetime import datetime, timedelta, timezone

    from reconciler import api

    now = datetime(2026, 11, 2, tzinfo=timezone.utc)
    docs = [topology(), tenant("a"), pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], hi=1),
            doc("PlacementPolicy", "pp", {"aging": {"step_hours": 24, "max_priority": "high"}}),
            job("n", tenant="a", priority="normal", **A100)]
    cfg = write_config(tmp_path / "cfg", docs)
    assert api.apply(cfg, time_limit=5).report.ok
    day_ago = (now - timedelta(hours=30)).isoformat()
    docs += [job("p99", tenant="a", priority=99, **A100), job("p5", tenant="a", priority=5, submitted=day_ago, **A100),
             job("old-low", tenant="a", priority="low", submitted=(now - timedelta(days=3)).isoformat(), **A100)]
    write_config(cfg, docs)

    def explained(name):
        return api.explain(cfg, name, time_limit=5, now=now)

    p99 = explained("p99")
    assert p99.state == "pending", p99.summary
    assert "; priority 99 (class normal: 10-99 rank alike); spot " in p99.details[0], p99.details[0]
    p5 = explained("p5")
    assert "; priority 5 (class low: 0-9 rank alike) (aged to 50, class normal: 10-99 rank alike); spot " in p5.details[0], p5.details[0]
    assert "; priority low (aged to 100); spot " in explained("old-low").details[0]  # aged to high's own value
    assert "; priority normal; spot " in explained("n").details[0]
