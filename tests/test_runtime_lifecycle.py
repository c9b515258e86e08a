"""What the reconciler reads back from the agents, as a pure function of plain data."""

from __future__ import annotations

import pytest

from reconciler.load import load
from reconciler.runtime.assign import build_assignments, spec_hash
from reconciler.runtime.lifecycle import runtime_view, unhealthy_instances
from tests.fleetkit import job, pool, report_written_ago, tenant, topology, write_config

NOW = 1_000_000.0


def desired(tmp_path, **spec):
    return load(write_config(tmp_path, [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"]),
                                        job("j", **{"cpu": 1, "replicas": 2, "run": {"command": ["train"]}, **spec})]))


def rec(d, replica, instance, phase, **kw):
    return {"job": "j", "replica": replica, "instance": instance, "spec_hash": spec_hash(d.jobs["j"]), "epoch": 1, "attempt": 0,
            "restarts": 0, "phase": phase, "reason": kw.pop("reason", phase), "terminal": phase in ("Succeeded", "Failed"), **kw}


def beat(age: float, state: str = "Ready", running=()):
    return {"heartbeat_at": NOW - age, "state": state, "running": list(running)}


def test_phases_follow_the_replicas_and_heartbeats(tmp_path):
    d = desired(tmp_path)
    placed = {"j": ["i-1", "i-2"]}
    agents = {"i-1": beat(1), "i-2": beat(1)}
    both = {("j", 0): rec(d, 0, "i-1", "Running"), ("j", 1): rec(d, 1, "i-2", "Running")}
    assert runtime_view(d, placed, both, agents, ["i-1", "i-2"], NOW, 60).jobs["j"].phase == "Running"
    one = {("j", 0): rec(d, 0, "i-1", "Running")}
    assert runtime_view(d, placed, one, agents, ["i-1", "i-2"], NOW, 60).jobs["j"].phase == "Starting"
    # A silent agent: never Running, AgentUnreachable, and a lost node to replace.
    silent = {"i-1": beat(1), "i-2": beat(300)}
    v = runtime_view(d, placed, both, silent, ["i-1", "i-2"], NOW, 60)
    assert v.jobs["j"].phase == "Unknown" and v.jobs["j"].reason == "AgentUnreachable"
    assert "lost node" in v.unhealthy["i-2"] and "i-1" not in v.unhealthy
    # Never reported: booting within the allowance, unreachable after it; never a lost node.
    v = runtime_view(d, placed, {}, {"i-1": beat(1)}, ["i-1", "i-2"], NOW, 60, launched={"i-2": NOW - 30}, boot=600)
    assert v.jobs["j"].phase == "Starting" and not v.unhealthy
    v = runtime_view(d, placed, {}, {"i-1": beat(1)}, ["i-1", "i-2"], NOW, 60, launched={"i-2": NOW - 900}, boot=600)
    assert v.jobs["j"].phase == "Unknown" and not v.unhealthy


def test_a_job_some_of_whose_replicas_completed_while_the_rest_run_is_running(tmp_path):
    """Replica 0 succeeded, replica 1 still runs: the job was shown "Starting (Completed: replica 0: Succeeded)" and
    counted starting, though nothing was being started; it runs (as a Kubernetes Job with completions does)."""
    d = desired(tmp_path)
    placed = {"j": ["i-1", "i-2"]}
    agents = {"i-1": beat(1), "i-2": beat(1)}
    half = {("j", 0): rec(d, 0, "i-1", "Succeeded", reason="Completed"), ("j", 1): rec(d, 1, "i-2", "Running")}
    v = runtime_view(d, placed, half, agents, ["i-1", "i-2"], NOW, 60)
    assert (v.jobs["j"].phase, v.jobs["j"].message) == ("Running", "1 replica(s) running, 1 completed")
    assert not v.finished
    booting = {("j", 0): rec(d, 0, "i-1", "Succeeded", reason="Completed")}  # the other not started yet: Starting
    assert runtime_view(d, placed, booting, agents, ["i-1", "i-2"], NOW, 60).jobs["j"].phase == "Starting"


def test_finished_jobs_stop_demanding_capacity_until_the_spec_changes(tmp_path):
    d = desired(tmp_path)
    done = {("j", 0): rec(d, 0, "i-1", "Succeeded"), ("j", 1): rec(d, 1, "i-2", "Succeeded")}
    v = runtime_view(d, {}, done, {}, [], NOW, 60)
    assert v.finished == {"j": "Succeeded"} and v.jobs["j"].phase == "Succeeded"
    half = {("j", 0): rec(d, 0, "i-1", "Succeeded")}
    assert runtime_view(d, {"j": ["i-1", "i-2"]}, half, {"i-1": beat(1), "i-2": beat(1)}, [], NOW, 60).finished == {}
    failed = {("j", 1): rec(d, 1, "i-2", "Failed", reason="BackoffLimitExceeded", message="exit code 1")}
    v = runtime_view(d, {}, failed, {}, [], NOW, 60)
    assert v.finished == {"j": "Failed"} and v.jobs["j"].reason == "BackoffLimitExceeded"
    changed = desired(tmp_path / "b", time_limit_hours=2)  # another spec: the old records do not count
    assert runtime_view(changed, {}, done, {}, [], NOW, 60).finished == {}


def test_a_failed_gang_shows_the_replica_that_failed_not_the_peers_it_stopped(tmp_path):
    """README: a replica that fails for good fails the job with its reason (Error with Never, BackoffLimitExceeded,
    StartError, DeadlineExceeded) and its last log lines; the others stop with GangFailed. The job showed the first
    failed record in replica order: replica 0's GangFailed ('replica 1 failed: Error') and replica 0's log lines,
    never the exit code and output of replica 1, the one that failed."""
    d = desired(tmp_path, restart={"policy": "Never"})
    recs = {("j", 0): rec(d, 0, "i-1", "Failed", reason="GangFailed", message="replica 1 failed: Error", exit_code=-15, log_tail=["R=0"]),
            ("j", 1): rec(d, 1, "i-2", "Failed", reason="Error", message="exit code 7 after 0 restart(s); last lines: boom",
                          exit_code=7, log_tail=["R=1", "boom"])}
    for placed, agents in (({}, {}), ({"j": ["i-1", "i-2"]}, {"i-1": beat(1), "i-2": beat(1)})):
        v = runtime_view(d, placed, recs, agents, ["i-1", "i-2"] if placed else [], NOW, 60)
        run = v.jobs["j"]
        assert v.finished == {"j": "Failed"}
        assert (run.phase, run.reason) == ("Failed", "Error"), run
        assert run.message.startswith("replica 1: exit code 7") and run.log_tail == ("R=1", "boom")
        assert dict((c[0], c) for c in run.conditions)["Failed"][2] == "Error"


def test_an_interrupting_instance_is_replaced_once_its_replicas_stopped():
    assert unhealthy_instances(["i-1"], {"i-1": beat(1, "Interrupting", ["j/0"])}, NOW, 60) == {}
    assert "interruption notice" in unhealthy_instances(["i-1"], {"i-1": beat(1, "Interrupting")}, NOW, 60)["i-1"]
    assert "stopped" in unhealthy_instances(["i-1"], {"i-1": beat(1, "Stopped")}, NOW, 60)["i-1"]


def test_assignments_carry_the_gang_and_a_new_epoch_only_when_the_placement_changes(tmp_path):
    d = desired(tmp_path)
    first = build_assignments(d, {"j": ["i-1", "i-1"]}, {"j": [[0, 1], [2, 3]]}, {"i-1": "aws"}, 5, {})
    (r0, r1) = first["i-1"]["replicas"]
    assert (r0["local_rank"], r1["local_rank"]) == (0, 1) and r0["world_size"] == 2 and r1["gpus"] == ["2", "3"]
    assert r0["master_instance"] == "i-1" and r0["master_port"] == 29500 and r0["epoch"] == 5
    same = build_assignments(d, {"j": ["i-1", "i-1"]}, {"j": [[0, 1], [2, 3]]}, {"i-1": "aws"}, 6, first)
    assert same["i-1"]["replicas"][0]["epoch"] == 5
    moved = build_assignments(d, {"j": ["i-1", "i-9"]}, {}, {"i-1": "aws", "i-9": "aws"}, 7, first)
    assert moved["i-9"]["replicas"][0]["epoch"] == 7 and moved["i-1"]["replicas"][0]["epoch"] == 7
    # where each rank runs, on every rank's entry (agent.unstarted_peers); a job of one replica has no peers
    assert moved["i-9"]["replicas"][0]["peers"] == moved["i-1"]["replicas"][0]["peers"] == ["i-1", "i-9"]
    assert "peers" not in build_assignments(d, {"j": ["i-1"]}, {}, {"i-1": "aws"}, 8, {})["i-1"]["replicas"][0]


def _published_hash(d, previous=None, serial=5):
    """The spec hash apply publishes for job j on unchanged placements (what the agent compares to restart it)."""
    out = build_assignments(d, {"j": ["i-1", "i-2"]}, {}, {"i-1": "aws", "i-2": "aws"}, serial, previous or {})
    assert out["i-1"]["replicas"][0]["epoch"] == (previous["i-1"]["replicas"][0]["epoch"] if previous else serial)
    return out, out["i-1"]["replicas"][0]["spec_hash"]


def test_scheduling_edits_neither_restart_nor_rerun_a_job_run_edits_do(tmp_path):
    """Audit: the spec hash covered the whole spec, so editing a job's priority or expected_hours restarted it (its agent
    saw a new hash) and ran a Succeeded batch job again. Only what changes the process counts now."""
    d = desired(tmp_path)
    first, h = _published_hash(d)
    done = {("j", 0): rec(d, 0, "i-1", "Succeeded"), ("j", 1): rec(d, 1, "i-2", "Succeeded")}
    for n, edit in enumerate([{"priority": "critical"}, {"expected_hours": 3}, {"spot": "never"}, {"submitted": "2026-01-01T00:00:00Z"},
                              {"priority": 7, "expected_hours": 100, "deadline": "2030-01-01T00:00:00Z", "regions": ["us-east-1"]}]):
        e = desired(tmp_path / f"s{n}", **edit)
        assert spec_hash(e.jobs["j"]) == h and _published_hash(e, first)[1] == h, edit
        assert runtime_view(e, {}, done, {}, [], NOW, 60).finished == {"j": "Succeeded"}, edit  # not run again
    for n, edit in enumerate([{"run": {"command": ["train", "--lr", "0.1"]}}, {"run": {"command": ["train"], "env": {"LR": "0.1"}}},
                              {"mode": "service"}, {"replicas": 3}]):
        e = desired(tmp_path / f"r{n}", **edit)
        assert spec_hash(e.jobs["j"]) != h and _published_hash(e, first)[1] != h, edit
        assert runtime_view(e, {}, done, {}, [], NOW, 60).finished == {}, edit  # a finished job runs again


def test_an_upgrade_from_whole_spec_hashes_restarts_and_reruns_nothing(tmp_path):
    """Records and assignments an older version wrote carry the whole spec's hash: they stay current while the spec is
    unchanged (no restart of every running job, no re-run of every finished one, on upgrade)."""
    from reconciler.runtime.assign import legacy_spec_hash

    d = desired(tmp_path)
    old = legacy_spec_hash(d.jobs["j"])
    assert old != spec_hash(d.jobs["j"])
    before, _ = _published_hash(d)
    for doc in before.values():
        for e in doc["replicas"]:
            e["spec_hash"] = old  # as the older version published it
    _, h = _published_hash(d, before)
    assert h == old  # the same hash again: the agents restart nothing
    done = {k: {**r, "spec_hash": old} for k, r in {("j", 0): rec(d, 0, "i-1", "Succeeded"), ("j", 1): rec(d, 1, "i-2", "Succeeded")}.items()}
    assert runtime_view(d, {}, done, {}, [], NOW, 60).finished == {"j": "Succeeded"}
    running = {k: {**r, "spec_hash": old} for k, r in {("j", 0): rec(d, 0, "i-1", "Running"), ("j", 1): rec(d, 1, "i-2", "Running")}.items()}
    assert runtime_view(d, {"j": ["i-1", "i-2"]}, running, {"i-1": beat(1), "i-2": beat(1)}, [], NOW, 60).jobs["j"].phase == "Running"
    # The first edit after the upgrade publishes the narrow hash (one restart, as before); from then on it is stable.
    e = desired(tmp_path / "e", run={"command": ["train"], "env": {"A": "1"}})
    after, h2 = _published_hash(e, before)
    assert h2 == spec_hash(e.jobs["j"])
    assert _published_hash(desired(tmp_path / "f", run={"command": ["train"], "env": {"A": "1"}}, priority="low"), after)[1] == h2


def test_plan_lists_a_running_job_whose_run_changed_and_apply_rolls_it_out(tmp_path):
    """Audit: editing a running job's `run` planned "No changes." (exit 0 with --detailed-exitcode) while apply
    published a new spec that restarted it; the controller never rolled it out. Agents off: apply still publishes."""
    import json

    from typer.testing import CliRunner

    from reconciler.cli import app
    from tests.fleetkit import copy_quickstart

    qs = copy_quickstart(tmp_path)
    runner = CliRunner()
    assert runner.invoke(app, ["apply", str(qs), "--auto-approve", "--time-limit", "10"]).exit_code == 0
    assert runner.invoke(app, ["plan", str(qs), "--detailed-exitcode", "--time-limit", "10"]).exit_code == 0
    # As an older version published them (the whole spec's hash): still no change, nothing restarts on upgrade.
    from reconciler.runtime.assign import legacy_spec_hash

    d = load(qs)
    for path in (qs / ".reconcile" / "assignments").glob("*.json"):
        doc = json.loads(path.read_text())
        for e in doc["replicas"]:
            e["spec_hash"] = legacy_spec_hash(d.jobs[e["job"]])
        path.write_text(json.dumps(doc))
    assert runner.invoke(app, ["plan", str(qs), "--detailed-exitcode", "--time-limit", "10"]).exit_code == 0
    jobs = qs / "jobs" / "platform.yaml"
    text = jobs.read_text()
    assert 'run: {command: [python3, bin/train.py, "150"]}\n' in text  # feature-etl's
    jobs.write_text(text.replace('run: {command: [python3, bin/train.py, "150"]}\n',
                                 'run: {command: [python3, bin/train.py, "150"], env: {LR: "0.1"}}\n', 1))
    plan = runner.invoke(app, ["plan", str(qs), "--detailed-exitcode", "--time-limit", "10", "--format", "json"])
    assert plan.exit_code == 2, plan.output
    restarted = json.loads(plan.stdout)["restarted"]
    assert [r["job"] for r in restarted] == ["feature-etl"] and len(restarted[0]["instances"]) == 1
    human = runner.invoke(app, ["plan", str(qs), "--time-limit", "10"])
    assert "1 restarted" in human.output and "restart in place" in human.output
    applied = runner.invoke(app, ["apply", str(qs), "--auto-approve", "--time-limit", "10"])
    assert applied.exit_code == 0 and "1 restarted" in applied.output, applied.output
    again = runner.invoke(app, ["plan", str(qs), "--detailed-exitcode", "--time-limit", "10", "--format", "json"])
    assert again.exit_code == 0 and "restarted" not in json.loads(again.stdout), again.output


def test_a_deleted_instances_heartbeat_stays_while_its_agent_still_stops_replicas(tmp_path):
    """Apply deletes the heartbeat keys of instances the cloud no longer lists, but not one whose agent still reports
    replicas running with a fresh heartbeat: a deleted instance shuts down through its replicas' checkpoint grace, and
    a replica the plan moved waits for its old copy by that report. Deleted at once, the moved copy started while
    the old one still wrote its checkpoint (the moved-replica race in test_runtime_sim)."""
    from reconciler.backend import backend_for
    from reconciler.runtime.bus import Bus, now_unix
    from reconciler.runtime.publish import publish

    d = desired(tmp_path / "c")
    backend = backend_for(tmp_path / "c")
    bus = Bus(backend)
    now = now_unix()
    bus.put_agent("i-stopping", {"instance": "i-stopping", "heartbeat_at": now - 1, "state": "Ready", "running": ["j/0"]})
    bus.put_agent("i-stopped", {"instance": "i-stopped", "heartbeat_at": now - 1, "state": "Stopped", "running": []})
    bus.put_agent("i-idle", {"instance": "i-idle", "heartbeat_at": now - 1, "state": "Ready", "running": []})
    bus.put_agent("i-stale", {"instance": "i-stale", "heartbeat_at": now - 3600, "state": "Ready", "running": ["j/1"]})
    report_written_ago(tmp_path / "c", "i-stale", 3600)  # (stale by the store's clock)
    publish(backend, d, {}, {}, 1, [], {}, tmp_path / "c", None, previous={"i-stopping": {"serial": 0, "replicas": []}})
    assert sorted(bus.agent_instances()) == ["i-stopping"]


def test_an_apply_that_changes_no_assignment_writes_none(tmp_path):
    """publish compared the published assignment, its publication time zeroed, with the new one, which has none: they
    never matched, so every apply wrote every instance's assignment again (10k instances: 10k object-store writes an
    apply, the controller's included). An unchanged one is left as it is; a changed one is written, and the serial of
    every apply stays above every published assignment's (api: the apply's serial counts from them)."""
    from providers.base import Instance
    from reconciler.backend import backend_for
    from reconciler.runtime.bus import Bus
    from reconciler.runtime.publish import publish

    d = desired(tmp_path / "c")
    backend = backend_for(tmp_path / "c")
    bus = Bus(backend)
    insts = [Instance(i, "sim", "aws", "us-east-1", "us-east-1a", "m6i.4xlarge", "on-demand", "running", "p",
                      launched_at="2026-12-01T00:00:00Z") for i in ("i-a", "i-b")]
    placements, gpus = {"j": ["i-a", "i-b"]}, {"j": [[], []]}
    assert publish(backend, d, placements, gpus, 1, insts, {}, tmp_path / "c", None) == 2
    first = bus.assignments()
    assert publish(backend, d, placements, gpus, 2, insts, {}, tmp_path / "c", None) == 0  # before: 2
    assert bus.assignments() == first
    moved = {"j": ["i-a", "i-a"]}
    assert publish(backend, d, moved, gpus, 3, insts, {}, tmp_path / "c", None) == 2  # i-a's changed, i-b's withdrawn
    assert bus.assignments()["i-a"]["serial"] == 3 and "i-b" not in bus.assignments()


def test_plan_lists_a_running_job_that_gains_or_loses_its_run(tmp_path):
    """Taking `run` out of a running job stops its process (apply withdraws its assignment) and putting one on a job
    placed without it (a reservation) starts one; both planned "No changes." (exit 0 with --detailed-exitcode), so a PR
    doing either was never applied by CI or the controller. They are listed with the run changes now."""
    import json

    from typer.testing import CliRunner

    from reconciler.cli import app
    from tests.fleetkit import copy_quickstart

    qs = copy_quickstart(tmp_path)
    runner = CliRunner()
    run_line = '  run: {command: [python3, bin/train.py, "150"]}\n'
    jobs = qs / "jobs" / "platform.yaml"
    text = jobs.read_text()
    assert text.count(run_line) >= 1

    def plan() -> tuple[int, dict]:
        res = runner.invoke(app, ["plan", str(qs), "--detailed-exitcode", "--time-limit", "10", "--format", "json"])
        return res.exit_code, json.loads(res.stdout)

    assert runner.invoke(app, ["apply", str(qs), "--auto-approve", "--time-limit", "10"]).exit_code == 0
    jobs.write_text(text.replace(run_line, "", 1))  # feature-etl keeps its place, without a process
    code, doc = plan()
    assert code == 2 and doc["restarted"] == [{"job": "feature-etl", "instances": doc["restarted"][0]["instances"], "change": "stops"}], doc
    human = runner.invoke(app, ["plan", str(qs), "--time-limit", "10"]).output
    assert "stops (run removed" in human
    assert "9 unchanged, 1 stopped; $" in human, human  # the summary line (the controller's log): not "1 restarted", each job once
    assert runner.invoke(app, ["apply", str(qs), "--auto-approve", "--time-limit", "10"]).exit_code == 0
    assert not [e for p in (qs / ".reconcile" / "assignments").glob("*.json")
                for e in json.loads(p.read_text())["replicas"] if e["job"] == "feature-etl"]
    assert plan()[0] == 0
    jobs.write_text(text)  # and back: it starts
    code, doc = plan()
    assert code == 2 and [(r["job"], r["change"]) for r in doc["restarted"]] == [("feature-etl", "starts")], doc
    assert "9 unchanged, 1 started; $" in runner.invoke(app, ["plan", str(qs), "--time-limit", "10"]).output
    assert runner.invoke(app, ["apply", str(qs), "--auto-approve", "--time-limit", "10"]).exit_code == 0
    assert plan()[0] == 0


def test_a_running_job_whose_run_was_edited_shows_its_old_process_running_until_the_apply(tmp_path):
    """`reconcile status` is live, as the agents report now: a job whose `run` was edited in the config (a merged PR, before
    the apply that restarts it) still runs its old spec. It was shown 'Starting (Assigned)' and counted starting (status,
    fleet.yaml, metrics), its Running condition flipped to False, while its processes ran and nothing new was assigned.
    Its old records count for what it shows, never for its finish: the edited spec demands capacity and runs again."""
    d = desired(tmp_path / "d")
    e = desired(tmp_path / "e", run={"command": ["train"], "env": {"LR": "0.1"}})
    old = spec_hash(d.jobs["j"])
    assert old != spec_hash(e.jobs["j"])
    placed, agents = {"j": ["i-1", "i-2"]}, {"i-1": beat(1, running=["j/0"]), "i-2": beat(1, running=["j/1"])}
    running = {("j", 0): rec(d, 0, "i-1", "Running", started_at="t0"), ("j", 1): rec(d, 1, "i-2", "Running", started_at="t0")}
    v = runtime_view(e, placed, running, agents, ["i-1", "i-2"], NOW, 60, published={"j": old})
    run = v.jobs["j"]
    assert (run.phase, run.reason) == ("Running", "Running"), run
    assert [r["phase"] for r in run.replicas] == ["Running", "Running"] and not v.finished
    # Its old spec's finish is not the edited job's: it is not finished, and shows no old terminal phase.
    done = {("j", 0): rec(d, 0, "i-1", "Succeeded"), ("j", 1): rec(d, 1, "i-2", "Succeeded")}
    v = runtime_view(e, placed, done, agents, ["i-1", "i-2"], NOW, 60, published={"j": old})
    assert not v.finished and v.jobs["j"].phase == "Starting"
    # Once the apply published the edited spec, the old records are history: Starting until its agents report it.
    v = runtime_view(e, placed, running, agents, ["i-1", "i-2"], NOW, 60, published={"j": spec_hash(e.jobs["j"])})
    assert v.jobs["j"].phase == "Starting" and not v.finished


def test_a_replica_whose_instance_is_gone_is_never_running_on_its_agents_last_report(tmp_path):
    """QA's rt3: a reclaimed instance's agent had written a heartbeat listing the replica running a moment before it
    was killed; for up to 60 s that report was fresh, and the job was shown Running on a terminated instance. An
    instance the cloud no longer lists (`gone`, from observe), or whose report was marked lost, is never Running."""
    d = desired(tmp_path)
    placed = {"j": ["i-1", "i-2"]}
    agents = {"i-1": beat(1, running=["j/0"]), "i-2": beat(1, running=["j/1"])}
    both = {("j", 0): rec(d, 0, "i-1", "Running"), ("j", 1): rec(d, 1, "i-2", "Running")}
    v = runtime_view(d, placed, both, agents, ["i-1"], NOW, 60, gone={"i-2": "the cloud no longer lists it"})
    run = v.jobs["j"]
    assert (run.phase, run.reason) == ("Unknown", "AgentUnreachable"), run
    assert [r["phase"] for r in run.replicas] == ["Running", "Unknown"]
    cond = {c[0]: c for c in run.conditions}
    assert cond["AgentUnreachable"][1] and "i-2 (its instance is gone" in cond["AgentUnreachable"][3]
    assert not cond["Running"][1]
    marked = {**agents, "i-2": {**beat(1), "state": "Stopped", "lost": "spot-interruption: the sim reclaimed it"}}
    v = runtime_view(d, placed, both, marked, ["i-1", "i-2"], NOW, 60)
    assert v.jobs["j"].phase == "Unknown" and "spot-interruption" in v.jobs["j"].message
    assert v.unhealthy == {"i-2": "gone: spot-interruption: the sim reclaimed it"}


def _rt3(tmp_path):
    """One CPU spot-required job with a checkpoint, as QA's rt3, applied on the sim (agents off: the test writes what
    the agent had reported just before the reclaim killed it)."""
    from typer.testing import CliRunner

    from reconciler.cli import app

    cfg = write_config(tmp_path / "rt3", [topology(), tenant("t"),
                                          pool("cpu", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], market="either"),
                                          job("slow", cpu=2, mem=4, spot="required", priority="high", run={"command": ["python3", "slow.py"]},
                                              checkpoint={"dir": "/ckpt", "signal": "SIGTERM", "grace_seconds": 60})])
    runner = CliRunner()
    out = runner.invoke(app, ["apply", str(cfg), "--auto-approve", "--time-limit", "10"])
    assert out.exit_code == 0, out.output
    return cfg, runner, app


def _running_report(cfg, iid):
    from reconciler.backend import backend_for
    from reconciler.runtime.bus import Bus, now_unix

    bus = Bus(backend_for(cfg))
    d = load(cfg)
    bus.put_agent(iid, {"instance": iid, "heartbeat_at": now_unix(), "state": "Interrupting", "notice": "spot-interruption",
                        "running": ["slow/0"], "address": "127.0.0.1"})
    bus.put_run("slow", 0, {"job": "slow", "replica": 0, "instance": iid, "spec_hash": spec_hash(d.jobs["slow"]), "epoch": 1,
                            "attempt": 0, "restarts": 0, "phase": "Running", "reason": "Running", "message": "", "terminal": False})
    return bus


def test_status_counts_the_boot_allowance_from_the_instances_launch_not_the_assignments_publication(tmp_path, monkeypatch):
    """An instance whose agent never reported is Starting (AgentStarting) for the boot allowance after its launch, then
    Unknown. `status` (which asks no cloud) counted it from when apply last published the instance's assignment: an
    edit of the job's run published it again, and status said Starting where metrics and the apply's own notes,
    which read the launch from the cloud, said Unknown (the claims audit's finding). Apply now publishes the launch."""
    import json
    import time

    cfg, runner, app = _rt3(tmp_path)
    monkeypatch.setenv("FLEETOPS_AGENT_BOOT_SECONDS", "4")
    time.sleep(5)  # past the allowance since the launch; no agent has reported
    write_config(cfg, [topology(), tenant("t"), pool("cpu", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], market="either"),
                       job("slow", cpu=2, mem=4, spot="required", priority="high", run={"command": ["python3", "slow.py"], "env": {"X": "1"}},
                           checkpoint={"dir": "/ckpt", "signal": "SIGTERM", "grace_seconds": 60})])
    out = runner.invoke(app, ["apply", str(cfg), "--auto-approve", "--time-limit", "10"])  # (restarts it in place: published again)
    assert out.exit_code == 0, out.output
    st = json.loads(runner.invoke(app, ["status", str(cfg), "--format", "json"]).stdout)["jobs"]["slow"]["status"]
    assert (st["phase"], st["run"]["reason"]) == ("Unknown", "AgentUnreachable"), st


def test_status_shows_a_reclaimed_instances_job_lost_at_once_not_running(tmp_path):
    """`sim interrupt` killed the instance mid-checkpoint; `status` said Running (its agent's report was 0-60 s old)
    while `plan` replaced the instance as gone. The sim, which is the cloud, marks the agent's report lost."""
    import json

    cfg, runner, app = _rt3(tmp_path)
    iid = json.loads((cfg / ".reconcile" / "state.json").read_text())["placements"]["slow"][0]
    bus = _running_report(cfg, iid)
    st = json.loads(runner.invoke(app, ["status", str(cfg), "--format", "json"]).stdout)
    assert st["jobs"]["slow"]["status"]["phase"] == "Running"  # the agent's fresh report, before the reclaim
    out = runner.invoke(app, ["sim", "interrupt", iid, str(cfg), "--notice-seconds", "0"])
    assert out.exit_code == 0, out.output
    st = json.loads(runner.invoke(app, ["status", str(cfg), "--format", "json"]).stdout)
    job_st = st["jobs"]["slow"]["status"]
    assert job_st["phase"] == "Unknown" and job_st["run"]["reason"] == "AgentUnreachable", job_st
    assert "gone" in job_st["run"]["message"] and iid in job_st["run"]["message"]
    assert bus.agent(iid)["running"] == [] and bus.agent(iid)["state"] == "Stopped"  # a moved copy waits for nothing
    human = runner.invoke(app, ["status", str(cfg)]).output
    assert "Running: 1 replica(s) running" not in human, human


def test_status_with_the_state_file_deleted_shows_the_jobs_where_the_last_apply_placed_them(tmp_path):
    """state.json deleted (or lost): `status` showed every running job "Pending (NotPlaced: waiting for a placement)"
    and the fleet "0 jobs running, N starting", reading the agents' reports against the state's now empty placements;
    the last apply's status files say where it placed them (plan and apply recover the placements from the tags)."""
    import json

    cfg, runner, app = _rt3(tmp_path)
    iid = json.loads((cfg / ".reconcile" / "state.json").read_text())["placements"]["slow"][0]
    _running_report(cfg, iid)
    (cfg / ".reconcile" / "state.json").unlink()
    st = json.loads(runner.invoke(app, ["status", str(cfg), "--format", "json"]).stdout)
    assert st["jobs"]["slow"]["status"]["phase"] == "Running", st["jobs"]["slow"]["status"]
    assert st["fleet"]["status"]["jobs"]["running"] >= 1, st["fleet"]["status"]["jobs"]


def test_apply_drops_the_report_of_an_instance_that_vanished_so_its_moved_replica_waits_for_nothing(tmp_path):
    """A real cloud reclaims an instance without a word on the bus: its agent's last report, fresh and listing the
    replica running, stayed (publish.shutting_down, meant for instances an apply shuts down), and the moved copy sat in
    WaitingForPredecessor until it went stale (60 s). Apply knows from observe that it vanished: the key goes, and
    the view combined with observed instances never shows a replica on it Running."""
    import json

    from providers.sim import SimCloud
    from reconciler.state import state_dir

    cfg, runner, app = _rt3(tmp_path)
    iid = json.loads((cfg / ".reconcile" / "state.json").read_text())["placements"]["slow"][0]
    bus = _running_report(cfg, iid)
    SimCloud(state_dir(cfg)).interrupt(iid)  # the cloud alone: nothing written on the bus
    from reconciler.backend import backend_for
    from reconciler.runtime.publish import read_view

    seen = read_view(backend_for(cfg), load(cfg), {"slow": [iid]}, [])  # as observed: the cloud lists no such instance
    assert (seen.jobs["slow"].phase, seen.jobs["slow"].reason) == ("Unknown", "AgentUnreachable"), seen.jobs["slow"]
    plan = runner.invoke(app, ["plan", str(cfg), "--time-limit", "10"])
    assert "gone (spot interruption or lost capacity)" in plan.output, plan.output
    out = runner.invoke(app, ["apply", str(cfg), "--auto-approve", "--time-limit", "10"])
    assert out.exit_code == 0, out.output
    assert iid not in bus.agent_instances()  # before: kept, fresh and "running", for up to 60 s
    new = json.loads((cfg / ".reconcile" / "state.json").read_text())["placements"]["slow"][0]
    assert new != iid
    st = json.loads(runner.invoke(app, ["status", str(cfg), "--format", "json"]).stdout)
    assert st["jobs"]["slow"]["status"]["phase"] != "Running"


def test_after_a_lost_state_file_a_running_agent_still_follows_the_next_edit(tmp_path):
    """README: losing the state is survivable (placements come back from the tags, "the next apply saves a serial above
    every tag's"). An agent takes an assignment only when its serial is not below the one it runs, and assignments were
    written with the state serial: after N edits of a running job and a lost state.json, the next edit was published at a
    serial below the agent's, which kept running the old command for good (status: Starting, Assigned). The apply's serial
    is now above every published assignment's too."""
    from pathlib import Path

    from reconciler import api
    from reconciler.backend import backend_for
    from reconciler.runtime.agent import Agent
    from reconciler.runtime.bus import Bus
    from reconciler.runtime.runtimes import ProcessRuntime

    def edit(v: int) -> Path:
        cfg = write_config(tmp_path / "c", [topology(), tenant("t"), pool("cpu", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"]),
                                            job("svc", cpu=2, run={"command": ["python3", "serve.py"], "env": {"V": str(v)}})])
        api.apply(cfg, time_limit=5)
        return cfg

    for v in range(3):
        cfg = edit(v)
    bus = Bus(backend_for(cfg))
    (iid,) = bus.assigned_instances()
    agent = Agent(iid, bus, ProcessRuntime(), tmp_path / "w", address="127.0.0.1", log=lambda m: None)
    agent._read_assignment()  # (no tick: only what the agent would take as its assignment, no process)
    assert agent.assignment["replicas"][0]["run"]["env"] == {"V": "2"}
    (cfg / ".reconcile" / "state.json").unlink()
    edit(3)
    agent._read_assignment()
    assert agent.assignment["replicas"][0]["run"]["env"] == {"V": "3"}, agent.assignment  # before: {"V": "2"}, for good


def test_a_gang_replica_still_on_the_epoch_before_a_move_is_not_shown_running(tmp_path):
    """Replica 1 moved (a new epoch); replica 0 stayed, and its agent still runs the old epoch's copy, checkpointing
    before its restart. Before, status read its record (Running, epoch 1) as current: the job showed Running, "2
    replica(s) running", through the whole checkpoint (6 s on the sim) while the gang was restarting. The published
    assignments' epoch decides now: that replica is Starting (Replaced) until its new copy reports."""
    from reconciler.backend import backend_for
    from reconciler.runtime.bus import Bus
    from reconciler.runtime.publish import read_view

    d = desired(tmp_path / "cfg")
    backend = backend_for(tmp_path, None)
    bus = Bus(backend)
    assign = build_assignments(d, {"j": ["i-1", "i-3"]}, {}, {"i-1": "sim", "i-3": "sim"}, 2, {})
    for iid, doc in assign.items():
        bus.put_assignment(iid, doc)
    now = __import__("time").time()
    for iid in ("i-1", "i-3"):
        bus.put_agent(iid, {"heartbeat_at": now, "state": "Ready", "running": [f"j/{0 if iid == 'i-1' else 1}"]})
    bus.put_run("j", 0, rec(d, 0, "i-1", "Running", epoch=1))  # the copy from before the move
    bus.put_run("j", 1, rec(d, 1, "i-3", "Running", epoch=2))
    v = read_view(backend, d, {"j": ["i-1", "i-3"]}, None).jobs["j"]
    assert v.phase == "Starting", v  # before: Running
    assert [(r["phase"], r["reason"]) for r in v.replicas] == [("Starting", "Replaced"), ("Running", "Running")], v.replicas
    bus.put_run("j", 0, rec(d, 0, "i-1", "Running", epoch=2))  # restarted at the new epoch
    assert read_view(backend, d, {"j": ["i-1", "i-3"]}, None).jobs["j"].phase == "Running"


def test_live_status_dates_a_condition_that_flipped_since_the_apply_from_the_reports_not_now(tmp_path):
    """The apply wrote the job Starting; then its replica started. Before, live `status` dated its Running condition
    now at every call until the next apply (a job the controller started was "Running since now" for its whole run,
    and a time in the JSON moved at each call); now from its replica's start, and a finish from its end."""
    import json

    cfg, runner, app = _rt3(tmp_path)
    iid = json.loads((cfg / ".reconcile" / "state.json").read_text())["placements"]["slow"][0]
    bus = _running_report(cfg, iid)
    bus.put_agent(iid, {**bus.agent(iid), "state": "Ready", "notice": None})
    rec = {**bus.run("slow", 0), "started_at": "2026-01-02T03:04:05+00:00"}
    bus.put_run("slow", 0, rec)

    def condition(kind):
        st = json.loads(runner.invoke(app, ["status", str(cfg), "--format", "json"]).stdout)["jobs"]["slow"]["status"]
        return next(c for c in st["conditions"] if c["type"] == kind)

    running = condition("Running")
    assert running["status"] == "True" and running["lastTransitionTime"] == "2026-01-02T03:04:05+00:00", running  # before: now
    bus.put_run("slow", 0, {**rec, "phase": "Succeeded", "reason": "Completed", "terminal": True, "exit_code": 0,
                            "finished_at": "2026-01-02T05:00:00+00:00"})
    assert condition("Succeeded")["lastTransitionTime"] == "2026-01-02T05:00:00+00:00"


def test_live_status_dates_a_condition_whose_file_lost_its_time_as_apply_does(tmp_path):
    """A job file whose condition has no lastTransitionTime (hand-edited, or restored from an old commit): `reconcile
    status` reads it (a condition needs a reason and a message), and apply dates such a condition anew, from the
    agents' reports. Live status kept the missing time as it was and showed `"lastTransitionTime": null`, where the
    next apply wrote the replica's start: the two definitions of how a condition is dated disagreed."""
    import json

    import yaml

    from reconciler.backend import backend_for
    from reconciler.runtime.publish import read_view
    from reconciler.state import utcnow
    from reconciler.status import Condition, StatusFiles, _conditions

    cfg, runner, app = _rt3(tmp_path)
    iid = json.loads((cfg / ".reconcile" / "state.json").read_text())["placements"]["slow"][0]
    bus = _running_report(cfg, iid)
    bus.put_agent(iid, {**bus.agent(iid), "state": "Ready", "notice": None})
    bus.put_run("slow", 0, {**bus.run("slow", 0), "started_at": "2026-01-02T03:04:05+00:00"})
    path = cfg / "status" / "jobs" / "slow.yaml"
    doc = yaml.safe_load(path.read_text())
    for c in doc["status"]["conditions"]:
        if c["type"] == "Running":
            c["status"] = "True"
            del c["lastTransitionTime"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))

    out = runner.invoke(app, ["status", str(cfg), "--format", "json"])
    assert out.exit_code == 0, out.output
    live = next(c for c in json.loads(out.stdout)["jobs"]["slow"]["status"]["conditions"] if c["type"] == "Running")
    run = read_view(backend_for(cfg), load(cfg), {"slow": [iid]}, None).jobs["slow"]
    with StatusFiles(cfg) as files:  # what apply writes for this file and these reports
        written = next(c for c in _conditions(files, path, [Condition(*c) for c in run.conditions], utcnow().isoformat(), dict(run.since))
                       if c["type"] == "Running")
    assert written["lastTransitionTime"] == "2026-01-02T03:04:05+00:00", written
    assert live == written, (live, written)  # before: live lastTransitionTime None


def test_status_shows_an_agent_that_cannot_write_its_own_files_beside_the_job_it_runs(tmp_path):
    """An agent whose disk fails (a local record of a replica it runs cannot be written) says so in its heartbeat
    (workdir_failed), and status showed the job Running with no word of it: an agent restarted there could neither
    adopt nor stop that replica. Status (JSON and human) names the instance and the agent's words; the job still runs."""
    import json

    cfg, runner, app = _rt3(tmp_path)
    iid = json.loads((cfg / ".reconcile" / "state.json").read_text())["placements"]["slow"][0]
    bus = _running_report(cfg, iid)
    why = "cannot write /var/lib/fleetops/replicas/slow-0.json: No space left on device (ENOSPC, errno 28)"
    bus.put_agent(iid, {**bus.agent(iid), "state": "Ready", "notice": None, "workdir_failed": why})
    st = json.loads(runner.invoke(app, ["status", str(cfg), "--format", "json"]).stdout)
    assert st["jobs"]["slow"]["status"]["phase"] == "Running"  # (it does run)
    fault = st["agents"][iid]
    assert fault["reason"] == "WorkdirFailed" and why in fault["message"], fault
    assert [r.get("agent_fault") for r in st["jobs"]["slow"]["status"]["run"]["replicas"]] == [fault["message"]]
    human = runner.invoke(app, ["status", str(cfg)]).output
    assert f"agent on {iid}: WorkdirFailed: " in human and why in human, human
    bus.put_agent(iid, {k: v for k, v in bus.agent(iid).items() if k != "workdir_failed"})  # the disk has room again
    st = json.loads(runner.invoke(app, ["status", str(cfg), "--format", "json"]).stdout)
    assert st["agents"] == {} and "agent_fault" not in st["jobs"]["slow"]["status"]["run"]["replicas"][0]
    assert "WorkdirFailed" not in runner.invoke(app, ["status", str(cfg)]).output


def test_status_names_an_agent_whose_replicas_orphans_cannot_be_tracked(tmp_path):
    """Where a replica's shim cannot be the subreaper of its processes (prctl refused, not Linux), the agent says so in
    its heartbeat (strays_untracked) and status shows it: an orphan that hides from the replica's end outlives it."""
    import json

    cfg, runner, app = _rt3(tmp_path)
    iid = json.loads((cfg / ".reconcile" / "state.json").read_text())["placements"]["slow"][0]
    bus = _running_report(cfg, iid)
    why = "prctl(PR_GET_CHILD_SUBREAPER) failed: Operation not permitted"
    bus.put_agent(iid, {**bus.agent(iid), "state": "Ready", "notice": None, "strays_untracked": why})
    st = json.loads(runner.invoke(app, ["status", str(cfg), "--format", "json"]).stdout)
    fault = st["agents"][iid]
    assert fault["reason"] == "StraysUntracked" and why in fault["message"], fault
    assert f"agent on {iid}: StraysUntracked: " in runner.invoke(app, ["status", str(cfg)]).output


def test_the_status_files_an_apply_writes_name_an_agent_that_cannot_write_its_own_files(tmp_path):
    """`reconcile status` showed an agent's WorkdirFailed (JSON `agents`), but status/fleet.yaml, which apply writes back
    into the config repo (what a reviewer of the repo sees), had no word of it. It carries the same `agents`, derived as
    status derives them; the files read alone (no bus) give them too, and an apply after the disk is repaired drops them."""
    import json

    import yaml

    from reconciler.status import read_status

    cfg, runner, app = _rt3(tmp_path)
    iid = json.loads((cfg / ".reconcile" / "state.json").read_text())["placements"]["slow"][0]
    bus = _running_report(cfg, iid)
    why = "cannot write /var/lib/fleetops/replicas/slow-0.json: No space left on device (ENOSPC, errno 28)"
    bus.put_agent(iid, {**bus.agent(iid), "state": "Ready", "notice": None, "workdir_failed": why})
    out = runner.invoke(app, ["apply", str(cfg), "--auto-approve", "--time-limit", "10"])
    assert out.exit_code == 0, out.output
    live = json.loads(runner.invoke(app, ["status", str(cfg), "--format", "json"]).stdout)["agents"]
    written = yaml.safe_load((cfg / "status" / "fleet.yaml").read_text())["status"].get("agents")
    assert written == live and written[iid]["reason"] == "WorkdirFailed" and why in written[iid]["message"], (written, live)
    assert read_status(cfg)["agents"] == live  # (the files alone: as the last apply saw them)
    bus.put_agent(iid, {k: v for k, v in bus.agent(iid).items() if k != "workdir_failed"})  # the disk has room again
    assert runner.invoke(app, ["apply", str(cfg), "--auto-approve", "--time-limit", "10"]).exit_code == 0
    assert "agents" not in yaml.safe_load((cfg / "status" / "fleet.yaml").read_text())["status"]
    assert read_status(cfg)["agents"] == {}


def test_status_names_the_plans_reason_for_a_pending_job_that_runs_something(tmp_path):
    """A job with `run` left pending on its tenant's quota showed in `reconcile status` as "Pending (NotPlaced: waiting
    for a placement)" (seen on a trace-shaped fleet, trace33), while the same job without `run` showed the plan's
    "quota exhausted: ...": the agents' view of an unplaced job says nothing the Placed condition does not say better."""
    from typer.testing import CliRunner

    from reconciler.cli import app

    run = {"command": ["python3", "train.py"]}
    cfg = write_config(tmp_path / "q", [topology(), tenant("t", cpu=4),
                                        pool("cpu", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"]),
                                        job("first", cpu=4, mem=4, priority="high", run=run), job("second", cpu=4, mem=4, run=run)])
    runner = CliRunner()
    out = runner.invoke(app, ["apply", str(cfg), "--auto-approve", "--time-limit", "10"])
    assert out.exit_code == 0, out.output
    human = runner.invoke(app, ["status", str(cfg)]).output
    line = next(x for x in human.splitlines() if "job second:" in x)
    assert "quota" in line and "waiting for a placement" not in line, human


@pytest.mark.parametrize("fault", ["garbled", "read fails"])
def test_a_deleted_instances_heartbeat_that_cannot_be_read_is_kept(tmp_path, fault):
    """An instance the apply deleted (not one that vanished) whose agent's report cannot be read: publish.shutting_down
    took that as "no evidence that it still runs" and deleted the key. The agent, still stopping its replicas through
    their grace, rewrote it within a heartbeat, but meanwhile the moved copy read the key as gone and started beside
    the old copy still checkpointing. What could not be read is never deleted; the moved copy waits on it."""
    from reconciler.backend import LocalBackend
    from reconciler.errors import ReconcileError
    from reconciler.runtime.bus import Bus, now_unix
    from reconciler.runtime.publish import publish

    class FailingReport(LocalBackend):
        def read_key(self, key: str):
            if fault == "read fails" and key == "agents/i-stopping.json":
                raise ReconcileError("s3: cannot read agents/i-stopping.json: connection reset by peer")
            return super().read_key(key)

    d = desired(tmp_path / "c")
    backend = FailingReport(tmp_path / "c")
    bus = Bus(backend)
    bus.put_agent("i-stopping", {"instance": "i-stopping", "heartbeat_at": now_unix() - 1, "state": "Ready", "running": ["j/0"]})
    if fault == "garbled":
        backend.write_key("agents/i-stopping.json", b'{"instance": "i-stopping", "runn')
    publish(backend, d, {}, {}, 1, [], {}, tmp_path / "c", None, previous={"i-stopping": {"serial": 0, "replicas": []}})
    assert bus.agent_instances() == ["i-stopping"]
