"""Metrics: `reconcile metrics DIR` (node_exporter textfile), status/metrics.prom written by apply, the /metrics
endpoint a long-running process serves, and the Grafana dashboard that reads them."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from reconciler import api
from reconciler.cli import app
from reconciler.metrics import METRICS, serve
from tests.fleetkit import copy_quickstart, report_written_ago

ROOT = Path(__file__).resolve().parent.parent


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "fleet"))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(ss, name, **labels) -> float:
    return ss[(name, tuple(sorted(labels.items())))]


@pytest.fixture
def applied(tmp_path):
    cfg = copy_quickstart(tmp_path)
    assert cli("apply", cfg, "--auto-approve").exit_code == 0
    return cfg


def report_runs(cfg: Path, phase=lambda job: ("Running", "Started")) -> dict[str, dict]:
    """Write to the bus what the agents would: a fresh heartbeat from every instance that runs a replica, and each
    published replica's run record in `phase(job)` ((phase, reason)). Returns the jobs' status documents."""
    import time

    from reconciler.api import backend_for
    from reconciler.runtime.bus import Bus

    status = {p.stem: yaml.safe_load(p.read_text())["status"] for p in (cfg / "status" / "jobs").glob("*.yaml")}
    bus = Bus(backend_for(cfg, None))
    entries = [r for p in (cfg / ".reconcile" / "assignments").glob("*.json") for r in json.loads(p.read_text())["replicas"]]
    now = time.time()
    for iid in {status[e["job"]]["instances"][e["replica"]] for e in entries}:
        bus.put_agent(iid, {"instance": iid, "heartbeat_at": now, "state": "Ready", "running": []})
    for e in entries:
        ph, why = phase(e["job"])
        bus.put_run(e["job"], e["replica"], {
            "job": e["job"], "replica": e["replica"], "instance": status[e["job"]]["instances"][e["replica"]],
            "spec_hash": e["spec_hash"], "epoch": e.get("epoch", 1), "attempt": int(why == "BackOff"),
            "restarts": int(why == "BackOff"), "phase": ph, "reason": why, "terminal": False,
            "started_at": "2026-11-29T10:00:00+00:00"})
    return status


def test_metrics_after_apply_agree_with_status(applied):
    status = yaml.safe_load((applied / "status" / "fleet.yaml").read_text())["status"]
    for text in ((applied / "status" / "metrics.prom").read_text(), cli("metrics", applied).output):
        ss = samples(text)
        assert {n for n, _ in ss} == set(METRICS)  # every metric, each with samples
        assert sum(v for (n, _), v in ss.items() if n == "fleetops_instances") == status["instances"]
        assert value(ss, "fleetops_cost_dollars_per_hour") == pytest.approx(status["hourlyCost"], abs=1e-3)
        for t, c in status["tenants"].items():
            assert value(ss, "fleetops_tenant_cost_dollars_per_hour", tenant=t) == pytest.approx(c["hourlyCost"], abs=1e-3)
        starting = sum(v for (n, lab), v in ss.items() if n == "fleetops_jobs" and ("phase", "starting") in lab)
        assert starting == status["jobs"]["starting"] == 9  # no agent has started them; llm-pretrain, without run, reserved
        reserved = sum(v for (n, lab), v in ss.items() if n == "fleetops_jobs" and ("phase", "reserved") in lab)
        assert reserved == status["jobs"]["reserved"] == 1
        gpus = value(ss, "fleetops_gpus", pool="aws-a100", gpu_type="A100")
        assert gpus == 16 == value(ss, "fleetops_gpus_allocated", pool="aws-a100", gpu_type="A100")  # llm-pretrain: 2 x 8
        assert value(ss, "fleetops_plan_changes_outstanding") == 0


def test_a_job_without_run_is_reserved_never_running(applied):
    """A Job without `run` is a reservation: placed, nothing started (the quickstart's llm-pretrain). Its status file, live
    `reconcile status` (and json), fleet.yaml's counts and the metrics said Running and counted it running. A job with
    `run` is not one (here its agents have not reported: Starting, counted starting)."""
    st = yaml.safe_load((applied / "status" / "jobs" / "llm-pretrain.yaml").read_text())["status"]
    conds = {c["type"]: c for c in st["conditions"]}
    assert st["phase"] == "Reserved" and len(st["instances"]) == 2 and "run" not in st
    assert conds["Placed"]["status"] == "True" and "nothing is started (the job has no run)" in conds["Placed"]["message"]
    assert "Running" not in conds
    assert yaml.safe_load((applied / "status" / "jobs" / "finetune-a.yaml").read_text())["status"]["phase"] != "Reserved"
    counts = yaml.safe_load((applied / "status" / "fleet.yaml").read_text())["status"]["jobs"]
    assert counts == {"running": 0, "starting": 9, "unknown": 0, "reserved": 1, "pending": 0, "succeeded": 0, "failed": 0}

    live = json.loads(cli("status", applied, "--format", "json").output)
    assert live["jobs"]["llm-pretrain"]["status"]["phase"] == "Reserved" and live["fleet"]["status"]["jobs"] == counts
    human = cli("status", applied).output.splitlines()
    assert " 10 instances, " in human[0] and " 0 jobs running, 9 starting, 1 reserved, 0 pending (last change" in human[0]
    assert any(line.startswith("  job llm-pretrain: Reserved (Placed: 2 replica(s) reserved on ") for line in human), human

    for text in ((applied / "status" / "metrics.prom").read_text(), cli("metrics", applied).output):
        ss = samples(text)
        assert value(ss, "fleetops_jobs", phase="reserved", tenant="research") == 1
        assert value(ss, "fleetops_jobs", phase="reserved", tenant="platform") == 0  # a zero, not "no data"
        assert sum(v for (n, lab), v in ss.items() if n == "fleetops_jobs" and ("phase", "starting") in lab) == 9


def test_a_run_added_or_taken_out_before_the_apply_counts_as_it_runs(applied):
    """`reconcile metrics` (and the report) show the fleet as it runs: a running job whose `run` was taken out still runs
    until the apply withdraws it, and a reservation given a `run` starts only at the apply. They counted the config's
    word (reserved, running) while `reconcile status` showed what runs (Running, Reserved)."""
    jobs = applied / "jobs" / "platform.yaml"
    text = jobs.read_text()
    run_line = '  run: {command: [python3, bin/train.py, "150"]}\n'
    assert run_line in text

    def counts() -> tuple[dict, dict]:
        ss = samples(cli("metrics", applied).output)
        metric = {ph: sum(v for (n, lab), v in ss.items() if n == "fleetops_jobs" and ("phase", ph) in lab)
                  for ph in ("running", "reserved")}
        live = json.loads(cli("status", applied, "--format", "json").output)["fleet"]["status"]["jobs"]
        return metric, {ph: live[ph] for ph in ("running", "reserved")}

    report_runs(applied)  # every replica runs
    jobs.write_text(text.replace(run_line, "", 1))  # feature-etl's process runs until the apply
    assert counts() == ({"running": 9, "reserved": 1},) * 2
    assert cli("apply", applied, "--auto-approve").exit_code == 0
    assert counts() == ({"running": 8, "reserved": 2},) * 2
    jobs.write_text(text)  # given its run back: it starts at the next apply
    assert counts() == ({"running": 8, "reserved": 2},) * 2


def test_a_spot_interruption_shows_in_the_metrics(applied):
    spot = next(line.split("\t")[0] for line in cli("sim", "ls", applied).output.splitlines() if "\tspot\t" in line)
    assert cli("sim", "interrupt", spot, applied).exit_code == 0
    ss = samples(cli("metrics", applied).output)
    assert value(ss, "fleetops_instances_lost") == 1
    assert value(ss, "fleetops_plan_changes_outstanding") == 1  # the replacement to create
    assert value(ss, "fleetops_pending_jobs", reason="awaiting-apply") == 1  # its job, until the next apply
    assert sum(v for (n, _), v in ss.items() if n == "fleetops_instances") == 9


def test_textfile_is_written_atomically_where_asked(applied, tmp_path):
    out = tmp_path / "textfile" / "fleetops.prom"
    r = cli("metrics", applied, "--out", out)
    assert r.exit_code == 0 and out.exists()
    assert not [p for p in out.parent.iterdir() if p != out]  # no temporary left behind
    assert samples(out.read_text())


def test_metrics_endpoint_serves_openmetrics(applied):
    """serve() is what a long-running process (the controller) calls; each scrape reads the source again."""
    res = api.plan(applied, time_limit=5)
    calls = []

    def source():
        calls.append(1)
        return api.fleet_view(res)

    server = serve(0, source)
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        req = urllib.request.Request(url, headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        with urllib.request.urlopen(req, timeout=30) as r:
            body = r.read().decode()
            assert r.headers["Content-Type"].startswith("application/openmetrics-text")
        assert body.rstrip().endswith("# EOF")
        with urllib.request.urlopen(url, timeout=30) as r:
            ss = samples(r.read().decode())
    finally:
        server.shutdown()
    assert len(calls) == 2
    assert value(ss, "fleetops_gpus", pool="aws-a100", gpu_type="A100") == 16


def test_grafana_dashboard_queries_only_exported_metrics():
    dash = json.loads((ROOT / "examples" / "grafana" / "fleetops-dashboard.json").read_text())
    labels = {"fleet", "pool", "gpu_type", "cloud", "zone", "market", "tenant", "phase", "reason"}
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if isinstance(v.get("query"), dict)]
    assert len(exprs) >= 15
    used = set()
    for e in exprs:
        names = set(re.findall(r"\bfleetops_[a-z0-9_]+", e))
        assert names and names <= set(METRICS), e
        used |= names
        for group in re.findall(r"\bby \(([^)]*)\)", e):
            assert {g.strip() for g in group.split(",")} <= labels, e
    # the list: GPUs, utilisation, $/h per tenant and pool, jobs per phase, pending per reason, queue wait,
    # preemptions, interruptions, over quota, plan duration, gap
    assert used >= {"fleetops_gpus_allocated", "fleetops_gpus_idle", "fleetops_gpu_utilization_ratio",
                    "fleetops_tenant_cost_dollars_per_hour", "fleetops_pool_cost_dollars_per_hour", "fleetops_jobs",
                    "fleetops_pending_jobs", "fleetops_queue_wait_seconds_avg", "fleetops_queue_wait_seconds_p95",
                    "fleetops_preemptions", "fleetops_instances_lost", "fleetops_tenant_over_quota",
                    "fleetops_plan_duration_seconds", "fleetops_solver_gap_ratio"}


def test_reconcile_controller_serves_metrics_of_the_fleet_it_applied(tmp_path):
    """Item 6: a /metrics endpoint wherever a long-running reconcile process exists. `reconcile controller` had none
    (serve() was only a library call): with --metrics-port it serves, at each scrape, the fleet its last plan or apply
    left, the same numbers the apply wrote to status/metrics.prom; SIGTERM stops it and the endpoint."""
    import os
    import signal
    import subprocess
    import sys

    from tests.fleetkit import poll_until

    cfg = copy_quickstart(tmp_path)
    log = tmp_path / "controller.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "reconciler.cli", "controller", str(cfg), "--metrics-port", "0",
                                 "--poll", "0.5", "--time-limit", "5"], stdout=out, stderr=subprocess.STDOUT, env=os.environ.copy())
    try:
        served_at = re.compile(r"serving /metrics on http://127\.0\.0\.1:(\d+)/metrics")
        poll_until(lambda: served_at.search(log.read_text()) or proc.poll() is not None, "the controller starts", 120)
        m = served_at.search(log.read_text())
        assert m and proc.poll() is None, log.read_text()
        port = m[1]
        poll_until(lambda: "applied plan" in log.read_text() or proc.poll() is not None, "the controller applies", 300)
        assert proc.poll() is None, log.read_text()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
            served = samples(r.read().decode())
        written = samples((cfg / "status" / "metrics.prom").read_text())
        for name in ("fleetops_gpus", "fleetops_gpus_allocated", "fleetops_instances", "fleetops_jobs", "fleetops_pending_jobs",
                     "fleetops_cost_dollars_per_hour", "fleetops_tenant_over_quota", "fleetops_solver_gap_ratio"):
            assert {k: v for k, v in served.items() if k[0] == name} == {k: v for k, v in written.items() if k[0] == name}, name
        assert value(served, "fleetops_gpus", pool="aws-a100", gpu_type="A100") == 16
        assert {k[0] for k in served} >= {"fleetops_queue_wait_seconds_p95", "fleetops_preemptions", "fleetops_instances_lost",
                                          "fleetops_plan_duration_seconds"}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 0, log.read_text()
    assert "stopped after 1 apply(s)" in log.read_text()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)


def test_queue_wait_is_the_average_and_nearest_rank_p95_of_pending_jobs_since_submitted(tmp_path):
    """Item 6's queue wait, by value: three jobs wait 100, 300 and 600 s since `submitted` and one has no submitted
    time (left out, not counted as 0): average 333.333 s, p95 600 s (nearest rank of 3). One is written as a YAML
    timestamp without a zone (UTC, as aging reads it): `reconcile metrics`, `report` and apply's status/metrics.prom
    raised TypeError (naive minus aware) on it; one is a quoted ISO string, which the schema allows and validate refused."""
    from datetime import datetime, timedelta, timezone

    from reconciler.metrics import exposition
    from tests.fleetkit import job, pool, tenant, topology, write_config

    now = datetime(2026, 11, 23, 12, 0, tzinfo=timezone.utc)
    jobs = [job("w100", gpus=1, gpu_type="A100", submitted=now - timedelta(seconds=100)),
            job("w300", gpus=1, gpu_type="A100", submitted=(now - timedelta(seconds=300)).isoformat()),  # a string
            job("w600", gpus=1, gpu_type="A100", submitted=(now - timedelta(seconds=600)).replace(tzinfo=None))]  # no zone
    write_config(tmp_path, [topology(), tenant("t"), pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], hi=2),
                            *jobs, job("undated", gpus=1, gpu_type="A100")])
    ss = samples(exposition(api.fleet_view(api.plan(tmp_path, time_limit=5), now=now)))
    assert sum(v for (n, lab), v in ss.items() if n == "fleetops_jobs" and ("phase", "pending") in lab) == 4  # none applied yet
    assert value(ss, "fleetops_queue_wait_seconds_avg") == pytest.approx(1000 / 3, abs=1e-3)
    assert value(ss, "fleetops_queue_wait_seconds_p95") == 600


def test_a_finished_batch_job_is_counted_as_succeeded_never_pending(tmp_path):
    """A batch job whose replicas all Succeeded demands nothing, so the plan leaves it out; status, fleet.yaml and the
    metrics counted it pending ("not in the plan"), and its `submitted` fed the queue wait forever (the quickstart with
    agents: "6 jobs running, 12 pending" when one was). `reconcile status --format json` showed the live phase beside the
    last apply's conditions (phase Succeeded, condition Succeeded False). The agent's report is written to the bus."""

    cfg = copy_quickstart(tmp_path)
    etl = cfg / "jobs" / "platform.yaml"
    etl.write_text(etl.read_text().replace("  tenant: platform\n", "  tenant: platform\n  submitted: 2026-01-01T00:00:00Z\n", 1))
    assert cli("apply", cfg, "--auto-approve").exit_code == 0
    entry = next(r for p in sorted((cfg / ".reconcile" / "assignments").glob("*.json"))
                 for r in json.loads(p.read_text())["replicas"] if r["job"] == "feature-etl")
    runs = cfg / ".reconcile" / "runs" / "feature-etl"
    runs.mkdir(parents=True, exist_ok=True)
    (runs / "0.json").write_text(json.dumps({
        "job": "feature-etl", "replica": 0, "instance": p_instance(cfg, "feature-etl"), "spec_hash": entry["spec_hash"],
        "epoch": entry.get("epoch", 1), "attempt": 0, "restarts": 0, "phase": "Succeeded", "reason": "Completed",
        "terminal": True, "exit_code": 0, "started_at": "2026-11-29T10:00:00+00:00", "finished_at": "2026-11-29T10:02:30+00:00"}))

    # Live, before the next apply: the document agrees with itself.
    res = cli("status", cfg, "--format", "json")
    assert res.exit_code == 0, res.output
    st = json.loads(res.output)
    job = st["jobs"]["feature-etl"]["status"]
    conds = {c["type"]: c for c in job["conditions"]}
    assert job["phase"] == "Succeeded"
    assert conds["Succeeded"]["status"] == "True" and conds["Running"]["status"] == "False", conds
    assert st["fleet"]["status"]["jobs"]["succeeded"] == 1 and st["fleet"]["status"]["jobs"]["pending"] == 0

    # The next apply releases its capacity: it is succeeded, not pending, everywhere.
    assert cli("apply", cfg, "--auto-approve").exit_code == 0
    counts = yaml.safe_load((cfg / "status" / "fleet.yaml").read_text())["status"]["jobs"]
    assert counts == {"running": 0, "starting": 8, "unknown": 0, "reserved": 1, "pending": 0, "succeeded": 1, "failed": 0}  # llm-pretrain: no run
    assert " 0 jobs running, 8 starting, 1 reserved, 0 pending, 1 succeeded (last change" in cli("status", cfg).output.splitlines()[0]
    for text in ((cfg / "status" / "metrics.prom").read_text(), cli("metrics", cfg).output):
        ss = samples(text)
        assert value(ss, "fleetops_jobs", phase="succeeded", tenant="platform") == 1
        assert sum(v for (n, lab), v in ss.items() if n == "fleetops_jobs" and ("phase", "pending") in lab) == 0
        assert value(ss, "fleetops_pending_jobs", reason="other") == 0
        assert value(ss, "fleetops_queue_wait_seconds_avg") == 0 == value(ss, "fleetops_queue_wait_seconds_p95")


def p_instance(cfg: Path, job: str) -> str:
    """The instance the last apply placed `job`'s first replica on (status/jobs/JOB.yaml)."""
    return yaml.safe_load((cfg / "status" / "jobs" / f"{job}.yaml").read_text())["status"]["instances"][0]


def test_a_job_its_agents_have_not_started_counts_starting_never_running(applied):
    """fleet.yaml's counts, live `reconcile status`, the metrics and the report counted every placed job with `run` as
    running, whatever its agents reported: a job in its restart's backoff (phase Starting, BackOff), or one whose
    agent had not started it yet, was "running". They count it as its phase says now: starting, or unknown while its
    agent is unreachable. The agents' reports are written to the bus as an agent writes them."""
    # Right after the apply nothing has started (no agent reported): starting, never running.
    counts = yaml.safe_load((applied / "status" / "fleet.yaml").read_text())["status"]["jobs"]
    assert counts["running"] == 0 and counts["starting"] == 9 and counts["reserved"] == 1, counts

    status = report_runs(applied, lambda job: ("Starting", "BackOff") if job == "finetune-a" else ("Running", "Started"))
    live = json.loads(cli("status", applied, "--format", "json").output)
    assert live["jobs"]["finetune-a"]["status"]["phase"] == "Starting"
    assert live["fleet"]["status"]["jobs"] == {"running": 8, "starting": 1, "unknown": 0, "reserved": 1, "pending": 0,
                                               "succeeded": 0, "failed": 0}
    assert " 8 jobs running, 1 starting, 1 reserved, 0 pending (last change" in cli("status", applied).output.splitlines()[0]
    ss = samples(cli("metrics", applied).output)
    by_phase = {ph: sum(v for (n, lab), v in ss.items() if n == "fleetops_jobs" and ("phase", ph) in lab)
                for ph in ("running", "starting", "reserved")}
    assert by_phase == {"running": 8, "starting": 1, "reserved": 1}
    assert value(ss, "fleetops_jobs", phase="starting", tenant=status["finetune-a"]["tenant"]) == 1

    # The next apply (nothing to change) writes the same counts into fleet.yaml, and the metrics file agrees.
    assert cli("apply", applied, "--auto-approve").exit_code == 0
    counts = yaml.safe_load((applied / "status" / "fleet.yaml").read_text())["status"]["jobs"]
    assert counts == live["fleet"]["status"]["jobs"], counts
    ss = samples((applied / "status" / "metrics.prom").read_text())
    assert value(ss, "fleetops_jobs", phase="starting", tenant=status["finetune-a"]["tenant"]) == 1

    # An unreachable agent: its jobs are unknown, not running.
    from reconciler.api import backend_for
    from reconciler.runtime.bus import Bus

    gone = status["finetune-a"]["instances"][0]
    Bus(backend_for(applied, None)).put_agent(gone, {"instance": gone, "heartbeat_at": 1.0, "state": "Ready", "running": []})
    report_written_ago(applied, gone, 3600)
    live = json.loads(cli("status", applied, "--format", "json").output)["fleet"]["status"]["jobs"]
    assert live["unknown"] >= 1 and live["running"] + live["unknown"] + live["starting"] == 9, live


@pytest.mark.parametrize("reason, kind", [
    ("quota exhausted: tenant t uses 8/8 GPUs in this plan, the job needs 1 more", "quota"),
    ("tenant budget: a spends $3.00/h of its $3.00/h", "tenant-budget"),
    ("budget: the fleet costs $7.35/h and max_hourly_budget is $8.00/h", "budget"),
    ("spot share: 4 of 8 GPUs on spot", "spot"),
    ("cloud quota: aws us-east-1 P instances 96/96 vCPU", "cloud-quota"),
    ("pools at max_instances (cpu 1/1)", "pool-max-instances"),
    # SpotPolicy's other rules are spot rules too, and a license has its own (all three were "other")
    ("tenant spot share: t's placed work is 60.0% on spot, over its tenant_max_spot_fraction 0.5", "spot"),
    ("on-demand buffer: 0 idle on-demand vCPU in the plan, 50% of 16 spot vCPU is needed", "spot"),
    ("license matlab: tenant research holds 2/2 of its quota, by sweep-1, sweep-2; the job needs 1", "license"),
])
def test_an_evicted_jobs_reason_counts_in_the_category_of_its_rule(reason, kind):
    """An evicted job's reason is its rule's, after "evicted: ": only "pools at max_instances" was matched past that
    prefix, and a job evicted for its tenant's quota, a budget, the spot share or a cloud quota was counted "other"
    in fleetops_pending_jobs and the report's pending plot."""
    from reconciler.fleetview import reason_kind

    assert reason_kind(reason) == kind
    assert reason_kind(f"evicted: {reason}") == kind


def test_jobs_evicted_to_reclaim_borrowed_room_count_as_guarantee(tmp_path):
    """Tenant b's 8 jobs on room it borrowed above its guarantee, evicted for tenant a's guaranteed work
    (tests/test_truth.py's fleet) and applied: the apply's fleetops_pending_jobs counts them under "guarantee" (the
    category was listed but no reason matched it), not under the pool's max_instances their reason also names."""
    from tests.fleetkit import job
    from tests.test_truth import A100, _borrowed_fleet

    cfg, r = _borrowed_fleet(tmp_path, dict(gpus=8, burst={"gpus": 16}),
                             [job(f"a-{i:02d}", tenant="a", priority="low", **A100) for i in range(8)])
    api.apply(cfg, saved_plan=r.plan, time_limit=5)
    ss = samples((cfg / "status" / "metrics.prom").read_text())  # (the apply's: `reconcile metrics` plans anew, where
    assert value(ss, "fleetops_pending_jobs", reason="guarantee") == 8  # they wait for the pool, pending, not evicted)
    assert value(ss, "fleetops_pending_jobs", reason="pool-max-instances") == 0
    assert value(samples(cli("metrics", cfg).output), "fleetops_pending_jobs", reason="pool-max-instances") == 8


def test_the_gap_gauge_is_the_gap_the_plan_claims_and_absent_where_it_claims_none(tmp_path):
    """A plan that claims no optimality gap (greedy best-fit's with --time-limit 0; tiers not proven) carries
    solver.gap 1.0 as a stand-in, and metrics exported it as the fleet's gap, 100%, beside a plan line saying "no
    optimality gap is claimed". The gauge now has no sample there; an optimal plan's is 0."""
    cfg = copy_quickstart(tmp_path)
    greedy = cli("metrics", cfg, "--time-limit", "0")
    assert greedy.exit_code == 0, greedy.output
    assert not [k for k in samples(greedy.output) if k[0] == "fleetops_solver_gap_ratio"]
    plan = cli("plan", cfg, "--time-limit", "0")
    assert "greedy best-fit" in plan.output
    solved = samples(cli("metrics", cfg).output)
    assert [v for k, v in solved.items() if k[0] == "fleetops_solver_gap_ratio"] == [0.0]
