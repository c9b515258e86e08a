"""The whole pipeline on the simulated cloud, through the CLI and the library API."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from typer.testing import CliRunner

from providers.sim import SimCloud
from reconciler import api
from reconciler.cli import app
from reconciler.errors import ApplyError, GuardrailError, LockError, StalePlanError
from reconciler.state import ApplyLock, load_state, state_dir
from tests.fleetkit import copy_quickstart, job, pool, tenant, topology, write_config
from tests.invariants import check_plan

runner = CliRunner()


def cli(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def qs(tmp_path):
    return copy_quickstart(tmp_path)


def live(cfg):
    return [i for i in SimCloud(state_dir(cfg)).instances() if i["state"] != "terminated"]


def test_quickstart_plans_applies_and_converges(qs):
    res = api.plan(qs)
    check_plan(res.desired, res.observed, res.plan)
    assert res.plan.solver.optimal
    counts = res.plan.counts()
    assert counts["place"] == 10 and counts["pending"] == 0 and counts["delete"] == 0
    assert {c.cloud for c in res.plan.creates} == {"aws", "gcp", "azure"}  # one plan across three clouds
    out = cli("apply", qs, "--auto-approve")
    assert out.exit_code == 0, out.output
    assert len(live(qs)) == counts["create"]
    again = cli("plan", qs, "--detailed-exitcode")
    assert again.exit_code == 0, again.output
    assert "No changes" in again.output
    # Status files: one per job and pool, with conditions and cost.
    st = yaml.safe_load((qs / "status/jobs/llm-pretrain.yaml").read_text())["status"]
    assert st["phase"] == "Reserved" and len(st["instances"]) == 2 and st["hourlyCost"] == pytest.approx(2 * 21.9576, abs=0.01)  # 2 p4d
    assert st["conditions"][0]["type"] == "Placed" and st["conditions"][0]["status"] == "True"
    pool_st = yaml.safe_load((qs / "status/pools/aws-cpu.yaml").read_text())["status"]
    assert pool_st["conditions"][0]["type"] == "Provisioned" and pool_st["conditions"][0]["status"] == "True"
    fleet = yaml.safe_load((qs / "status/fleet.yaml").read_text())["status"]
    assert fleet["hourlyCost"] == pytest.approx(res.plan.cost_after, abs=0.01)
    assert set(fleet["tenants"]) == {"research", "product", "platform"}


def test_spot_interruption_is_healed_in_one_run(qs):
    cli("apply", qs, "--auto-approve")
    spot = next(i for i in live(qs) if i["market"] == "spot")
    before = yaml.safe_load((qs / "status/fleet.yaml").read_text())["status"]["hourlyCost"]
    assert cli("sim", "interrupt", spot["id"], "--dir", qs).exit_code == 0
    drift = cli("plan", qs, "--detailed-exitcode")
    assert drift.exit_code == 2, drift.output
    assert "1 to create" in drift.output
    replaced = [j for j in api.plan(qs).plan.jobs if j.action == "place"]
    assert len(replaced) == 1 and replaced[0].reason == f"replaces {spot['id']}: gone (spot interruption or lost capacity)"
    healed = cli("apply", qs, "--auto-approve")
    assert healed.exit_code == 0, healed.output
    assert cli("plan", qs, "--detailed-exitcode").exit_code == 0
    after = yaml.safe_load((qs / "status/fleet.yaml").read_text())["status"]
    assert after["jobs"]["pending"] == 0 and after["hourlyCost"] == pytest.approx(before, abs=0.5)
    assert spot["id"] not in {i["id"] for i in live(qs)}


def test_the_quick_starts_interrupt_names_the_instance_of_the_job_it_says(qs):
    """README's quick start interrupts "finetune-a's spot instance" by id, then reads finetune-a's log for its resume
    from a checkpoint: the id must be the one finetune-a runs on once the quickstart is applied (it named
    sim-gcp-00008, finetune-b's)."""
    import re

    from tests.fleetkit import ROOT

    m = re.search(r"reconcile sim interrupt (\S+) examples/quickstart +# (\S+)'s spot instance", (ROOT / "README.md").read_text())
    assert m, "README's quick start no longer interrupts a job's instance by id"
    iid, job_name = m.groups()
    assert cli("apply", qs, "--auto-approve").exit_code == 0
    runs_on = {j.job: j.instances for j in api.plan(qs).plan.jobs}
    assert runs_on[job_name] == (iid,), (job_name, runs_on[job_name], iid)
    assert next(i for i in live(qs) if i["id"] == iid)["market"] == "spot"


def test_an_instance_in_a_state_or_cloud_fleetops_does_not_know_is_no_crash_and_no_duplicate(qs):
    """An instance whose state is none of ours was read as gone: its job was launched again beside it while it may
    still run. One in a cloud the catalog and Topology do not know crashed the solver ("unexpected OverflowError:
    cannot convert float infinity to integer": the egress to a site outside the Topology). Now the first is kept as
    running, with a note, and nothing is launched in its place; the second has drifted from its pool (in cloud ibm,
    not aws) and is replaced, make before break, as any drifted instance is."""
    assert cli("apply", qs, "--auto-approve").exit_code == 0
    sim = SimCloud(state_dir(qs))
    p4d = sorted(i["id"] for i in live(qs) if i["instance_type"] == "p4d.24xlarge")
    with sim.world() as w:
        w["instances"][p4d[0]] = {**w["instances"][p4d[0]], "state": "impaired"}
    res = api.plan(qs)
    assert not res.plan.creates and not res.plan.deletes, res.plan.counts()
    assert any(n.startswith(f"{p4d[0]} reports state 'impaired', which is none of") and "nothing runs twice" in n
               for n in res.plan.notes), res.plan.notes
    with sim.world() as w:
        w["instances"][p4d[0]] = {**w["instances"][p4d[0]], "state": "running", "cloud": "ibm"}
    out = cli("plan", qs)
    assert out.exit_code == 0 and "unexpected" not in out.output, out.output
    res = api.plan(qs)
    assert [(d.instance_id, d.reason) for d in res.plan.deletes] == [(p4d[0], "drifted from Pool/aws-a100 (in cloud ibm, not aws)")]
    assert len(res.plan.creates) == 1
    check_plan(res.desired, res.observed, res.plan)


def test_capacity_error_marks_zone_short_and_next_run_goes_elsewhere(qs):
    cloud = SimCloud(state_dir(qs))
    plan = api.plan(qs).plan
    target = next(c for c in plan.creates if c.pool == "gcp-l4-spot")
    # The cloud says "no" only at create time (the plan did not know), to L4s only: the A100 pool buys in the same zone.
    cloud.exhaust(target.zone, instance_type=target.instance_type)
    out = cli("apply", qs, "--auto-approve")
    assert out.exit_code == 1
    assert "InsufficientCapacity" in out.output and "zone marked short" in out.output
    assert ("gcp", target.zone, target.instance_type, target.market) in load_state(qs).short_now()
    embed = yaml.safe_load((qs / "status/jobs/embed-batch.yaml").read_text())["status"]
    assert embed["phase"] == "Pending" and embed["conditions"][0]["reason"] == "ProvisioningFailed"
    l4 = yaml.safe_load((qs / "status/pools/gcp-l4-spot.yaml").read_text())["status"]["conditions"][0]
    assert l4["status"] == "False" and "1 create(s) failed: sim: InsufficientCapacity" in l4["message"]
    others = yaml.safe_load((qs / "status/pools/gcp-a100.yaml").read_text())["status"]["conditions"][0]
    assert others["status"] == "True"
    retry = api.plan(qs).plan
    assert all(c.zone != target.zone for c in retry.creates if c.pool == "gcp-l4-spot")
    assert cli("apply", qs, "--auto-approve").exit_code == 0
    assert cli("plan", qs, "--detailed-exitcode").exit_code == 0


def test_saved_plan_applies_once_and_goes_stale(qs, tmp_path):
    out = tmp_path / "plan.json"
    assert cli("plan", qs, "--format", "json", "--out", out).exit_code == 0
    saved = json.loads(out.read_text())
    assert saved["creates"] and saved["id"]
    assert cli("apply", qs, "--plan", out).exit_code == 0
    stale = cli("apply", qs, "--plan", out)
    assert stale.exit_code == 1 and "stale plan" in stale.output
    # Editing the desired state also makes a plan stale, before any provider call.
    cli("plan", qs, "--out", out)
    (qs / "jobs/platform.yaml").write_text((qs / "jobs/platform.yaml").read_text().replace("cpu: 2,", "cpu: 3,"))
    n = len(live(qs))
    with pytest.raises(StalePlanError, match="desired state changed"):
        from reconciler.plan import Plan
        api.apply(qs, saved_plan=Plan.from_json(out.read_text()))
    assert len(live(qs)) == n


def test_rerun_after_crash_creates_no_duplicates(qs, monkeypatch):
    """Creates carry idempotency keys: replaying the same creates yields the same instances."""
    monkeypatch.setattr("reconciler.apply.BACKOFF_S", 0.0)
    res = api.plan(qs)
    sim = SimCloud(state_dir(qs))
    from reconciler.apply import apply_plan
    from reconciler.observe import Fleet
    from reconciler.state import State
    fleet = Fleet(res.desired, state_dir(qs))
    # First attempt dies after 3 creates (the sim times out every call after that).
    sim.set_fault(fail_after=3)
    report = apply_plan(res.desired, res.observed, res.plan, fleet, State())
    assert len(report.created) == 3 and not report.ok
    sim.set_fault(fail_after=None)
    # Replaying the same plan: the three keys already exist and are reused.
    report2 = apply_plan(res.desired, res.observed, res.plan, fleet, State())
    assert report2.ok
    assert {k: v for k, v in report2.created.items() if k in report.created} == report.created
    assert len(live(qs)) == len(res.plan.creates)
    keys = [i["tags"]["fleetops.io/create-key"] for i in live(qs)]
    assert len(keys) == len(set(keys))


def test_killed_apply_then_rerun_converges_without_leaks(qs, tmp_path):
    """SIGKILL an apply mid-flight (held after 3 of its 10 launches: tests/gates.py), rerun: no duplicates, no leaks."""
    import signal

    from tests.gates import Gate

    gate = Gate(tmp_path / "gate", "sim", 3)
    proc = subprocess.Popen([sys.executable, "-m", "reconciler.cli", "apply", str(qs), "--auto-approve"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=gate.env(), start_new_session=True)
    try:
        gate.wait(lambda: proc.pid in gate.reached() or proc.poll() is not None, what="the apply held after 3 launches")
        assert proc.poll() is None, "the apply ended before the kill point: the kill tested nothing"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    n_partial = len(live(qs))
    assert n_partial == 3
    # The dead process's lock is stale (its pid is gone) and is taken over.
    assert cli("apply", qs, "--auto-approve").exit_code == 0
    assert cli("plan", qs, "--detailed-exitcode").exit_code == 0
    res = api.plan(qs)
    used = {i for j in res.plan.jobs for i in j.instances}
    pool_min = {"aws-cpu"}
    for inst in live(qs):
        assert inst["id"] in used or inst["tags"]["fleetops.io/pool"] in pool_min, f"leaked {inst['id']}"
    keys = [i["tags"]["fleetops.io/create-key"] for i in live(qs)]
    assert len(keys) == len(set(keys))


def test_unmanaged_instances_survive_everything(qs):
    sim = SimCloud(state_dir(qs))
    theirs = sim.plant("aws", "us-east-1", "us-east-1a", "p4d.24xlarge", tags={"owner": "someone"})
    other = sim.plant("aws", "us-east-1", "us-east-1a", "p4d.24xlarge", tags={"fleetops.io/fleet": "another-fleet", "fleetops.io/pool": "aws-a100"})
    assert cli("apply", qs, "--auto-approve").exit_code == 0
    # Remove every job: the reconciler deletes its own idle instances, nobody else's.
    for f in (qs / "jobs").glob("*.yaml"):
        f.unlink()
    out = cli("apply", qs, "--auto-approve", "--allow-destroy", "20")
    assert out.exit_code == 0, out.output
    alive = {i["id"] for i in live(qs)}
    assert theirs in alive and other in alive
    assert len([i for i in live(qs) if i["tags"].get("fleetops.io/fleet") == "quickstart"]) == 1  # aws-cpu min 1
    from providers.base import Instance
    from providers.sim import SimProvider
    from providers.base import ProviderContext
    from reconciler.errors import OwnershipError
    prov = SimProvider(ProviderContext("quickstart", state_dir(qs)))
    with pytest.raises(OwnershipError):
        prov.delete(Instance(theirs, "sim", "aws", "us-east-1", "us-east-1a", "p4d.24xlarge", "on-demand", "running", "aws-a100"))


def test_destroy_guardrail_refuses_before_any_call(qs):
    assert cli("apply", qs, "--auto-approve").exit_code == 0
    for f in (qs / "jobs").glob("*.yaml"):
        f.unlink()
    n = len(live(qs))
    plan = cli("plan", qs)
    assert "GUARDRAIL: max_destroy_per_apply: would destroy 9 instances, the limit is 6" in plan.output
    with pytest.raises(GuardrailError, match="--allow-destroy 9"):
        api.apply(qs)
    assert len(live(qs)) == n
    assert cli("apply", qs, "--auto-approve", "--allow-destroy", "9").exit_code == 0
    assert len(live(qs)) == 1


def test_lock_stops_a_second_apply(qs):
    with ApplyLock(qs) as held:
        with pytest.raises(LockError, match=held.id):
            api.apply(qs)
        out = cli("apply", qs, "--auto-approve")
        assert out.exit_code == 1 and held.id in out.output and "it is running" in out.output  # (no unlock: it would be refused)
    assert not live(qs)
    assert cli("apply", qs, "--auto-approve").exit_code == 0


def test_throttling_is_retried(qs):
    SimCloud(state_dir(qs)).set_fault(throttle=2)
    assert cli("apply", qs, "--auto-approve").exit_code == 0
    assert cli("plan", qs, "--detailed-exitcode").exit_code == 0


def test_markdown_and_json_formats(qs):
    md = cli("plan", qs, "--format", "markdown")
    assert md.exit_code == 0
    assert md.output.startswith("### fleetops plan for `quickstart`")
    assert "**10 to create, 0 to delete; jobs: 10 placed" in md.output
    assert "<details><summary>aws:" in md.output
    js = json.loads(cli("plan", qs, "--format", "json").output)
    assert js["solver"]["optimal"] is True and len(js["jobs"]) == 10


def test_bad_config_changes_nothing(qs):
    (qs / "jobs/oops.yaml").write_text("apiVersion: fleetops.io/v1alpha1\nkind: Job\nmetadata: {name: oops}\nspec: {tenant: research}\n")
    out = cli("apply", qs, "--auto-approve")
    assert out.exit_code == 1 and "oops.yaml:4: Job/oops: spec.resources: Field required" in out.output
    assert not (qs / ".reconcile/sim/cloud.json").exists() or not live(qs)


def test_interactive_apply_needs_a_terminal(qs):
    out = cli("apply", qs)
    assert out.exit_code == 1 and "--auto-approve" in out.output
    assert not live(qs)


def test_partial_failure_exit_code_and_report(tmp_path):
    cfg = write_config(tmp_path / "c", [topology(), tenant("t"),
                                        pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], market="on-demand"),
                                        job("a", gpus=1, gpu_type="A100", cpu=4, mem=16)])
    SimCloud(state_dir(cfg)).exhaust("us-central1-a", market="on-demand")
    with pytest.raises(ApplyError, match="zone marked short") as e:
        api.apply(cfg)
    assert e.value.result.report.failures  # type: ignore[attr-defined]
    nxt = api.plan(cfg).plan
    assert nxt.jobs[0].action == "pending" and "cool-off" in nxt.jobs[0].reason


def test_long_markdown_plan_is_truncated_and_full_plan_saved(tmp_path, monkeypatch):
    """The note points at the file --out wrote; without --out nothing is written behind the user's back and the
    note says how to get the whole plan (issue 21: it pointed at a plan.json nobody asked for)."""
    cfg = write_config(tmp_path / "c", [topology(), tenant("t"),
                                        pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], hi=100),
                                        *[job(f"job-{i:03d}", gpus=1, gpu_type="A100", cpu=4, mem=16, spot="never") for i in range(75)]])
    monkeypatch.chdir(tmp_path)
    out = cli("plan", cfg, "--format", "markdown", "--out", "plan.json")
    assert out.exit_code == 0
    assert "_... 15 more rows truncated; the full plan is in `plan.json`_" in out.output
    assert out.output.count("| + create |") == 60
    full = json.loads((tmp_path / "plan.json").read_text())
    assert len(full["creates"]) == 75
    (tmp_path / "plan.json").unlink()
    bare = cli("plan", cfg, "--format", "markdown")
    assert "_... 15 more rows truncated; run `reconcile plan --format json` for the full plan_" in bare.output
    assert not (tmp_path / "plan.json").exists()


def test_markdown_shows_guardrail_violations(qs):
    assert cli("apply", qs, "--auto-approve").exit_code == 0
    for f in (qs / "jobs").glob("*.yaml"):
        f.unlink()
    md = cli("plan", qs, "--format", "markdown").output
    assert "> :no_entry: **Guardrail:** max_destroy_per_apply: would destroy 9 instances" in md


def test_partial_batch_failure_reports_both_sides_exits_1_and_the_next_run_converges(qs):
    """Every third launch is refused (not retryable): apply creates the rest, says which
    failed, exits 1, and keeps what it made; the next apply adds only what is missing."""
    assert cli("sim", "fault", "--dir", qs, "--reject-every", "3").exit_code == 0
    out = cli("apply", qs, "--auto-approve")
    assert out.exit_code == 1
    first = {i["id"] for i in live(qs)}
    assert len(first) == 7  # 10 launches planned, 3 refused
    assert out.output.count("InvalidParameterValue") == 3 and "partly: 7 created" in out.output
    assert cli("sim", "fault", "--dir", qs, "--reject-every", "0").exit_code == 0
    assert cli("apply", qs, "--auto-approve").exit_code == 0
    after = live(qs)
    assert first <= {i["id"] for i in after} and len(after) == 10
    keys = [i["tags"]["fleetops.io/create-key"] for i in after]
    assert len(keys) == len(set(keys))
    assert cli("plan", qs, "--detailed-exitcode").exit_code == 0
