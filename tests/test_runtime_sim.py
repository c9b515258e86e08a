"""Jobs that run, end to end on the sim: one real `reconcile agent` process per instance, real
replica processes, the local bus. Periods are shortened through the environment; every wait polls
for a condition with a generous timeout (the machine is shared), and every agent and replica
process is killed at the end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from providers.sim import SimCloud
from reconciler import api
from reconciler.backend import backend_for
from reconciler.runtime.bus import Bus
from reconciler.state import state_dir
from tests.fleetkit import ROOT, job, poll_until, pool, tenant, topology, write_config

PY = sys.executable
TRAIN = str(ROOT / "examples" / "quickstart" / "bin" / "train.py")


@pytest.fixture
def rt(monkeypatch, tmp_path):
    """Agents on, short periods; afterwards, every agent and replica under tmp_path is killed."""
    for k, v in {"FLEETOPS_SIM_AGENTS": "1", "FLEETOPS_AGENT_POLL_SECONDS": "0.2", "FLEETOPS_AGENT_HEARTBEAT_SECONDS": "0.5",
                 "FLEETOPS_HEARTBEAT_STALE_SECONDS": "15", "FLEETOPS_RESTART_BACKOFF_SECONDS": "0.2",
                 "FLEETOPS_AGENT_BOOT_SECONDS": "60", "FLEETOPS_SIM_NOTICE_SECONDS": "60"}.items():
        monkeypatch.setenv(k, v)
    # (inherited by the agents and their replicas: replicas_on counts only this test's, not another test's or another
    # checkout's sim-aws-00001 running at the same time, which failed three tests here while other runs went on)
    monkeypatch.setenv("FLEETOPS_TEST_RUN", str(tmp_path))
    yield tmp_path
    for d in tmp_path.rglob(".reconcile"):
        SimCloud(d).stop_all_agents()


def config(path: Path, *jobs: dict, hi: int = 4) -> Path:
    return write_config(path, [topology(), tenant("t"), pool("cpu", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], hi=hi), *jobs])


def wait(cond, timeout: float = 90.0, what: str = "condition"):
    return poll_until(cond, what, timeout)


def replicas_on(instance: str) -> list[int]:
    """Live replica processes this test started for `instance` (their environment names both; no pgrep needed)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            env = (p / "environ").read_bytes().split(b"\0")
            state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        mine = f"FLEETOPS_TEST_RUN={os.environ.get('FLEETOPS_TEST_RUN', '')}".encode()
        if f"FLEETOPS_INSTANCE={instance}".encode() in env and mine in env and state != "Z":
            out.append(int(p.name))
    return out


def live(cfg: Path) -> list[str]:
    return [i["id"] for i in SimCloud(state_dir(cfg)).instances() if i["state"] != "terminated"]


def bus(cfg: Path) -> Bus:
    return Bus(backend_for(cfg, None))


def run_phase(cfg: Path, name: str, replica: int = 0):
    r = bus(cfg).run(name, replica)
    return r["phase"] if r else None


def job_status(cfg: Path, name: str) -> dict:
    return yaml.safe_load((cfg / "status" / "jobs" / f"{name}.yaml").read_text())["status"]


def test_a_batch_job_runs_to_succeeded_and_its_instance_is_reclaimed(rt):
    cfg = config(rt / "c", job("etl", cpu=2, run={"command": [PY, "-c", "print('rows written: 42')"]}))
    res = api.apply(cfg, time_limit=5)
    assert len(res.report.created) == 1
    iid = live(cfg)[0]
    rec = wait(lambda: (r := bus(cfg).run("etl", 0)) and r["terminal"] and r, what="etl finished")
    assert rec["phase"] == "Succeeded" and rec["instance"] == iid and rec["log_tail"] == ["rows written: 42"]
    from typer.testing import CliRunner

    from reconciler.cli import app

    out = CliRunner().invoke(app, ["logs", str(cfg), "etl", "--follow"])  # ends with the replica
    assert out.exit_code == 0 and "rows written: 42" in out.output and "etl/0: Succeeded (Completed: exit code 0)" in out.output
    again = api.plan(cfg, time_limit=5)
    assert [d.instance_id for d in again.plan.deletes] == [iid]  # its capacity is freed
    assert any("job etl Succeeded" in n for n in again.plan.notes)
    api.apply(cfg, time_limit=5)
    assert live(cfg) == []
    st = job_status(cfg, "etl")
    assert st["phase"] == "Succeeded" and st["conditions"][0]["reason"] == "Finished"
    assert {c["type"]: c["status"] for c in st["conditions"]}["Succeeded"] == "True"
    assert not api.plan(cfg, time_limit=5).plan.has_changes  # not started again while its spec is unchanged
    # A changed spec is a new run.
    config(rt / "c", job("etl", cpu=2, run={"command": [PY, "-c", "print('rows written: 43')"]}))
    assert len(api.plan(cfg, time_limit=5).plan.creates) == 1


def test_a_job_failing_past_its_backoff_limit_is_failed_with_its_last_lines(rt):
    cmd = [PY, "-c", "import sys; print('CUDA error: out of memory'); sys.exit(1)"]
    cfg = config(rt / "c", job("oom", cpu=2, run={"command": cmd}, restart={"policy": "OnFailure", "backoff_limit": 2}))
    api.apply(cfg, time_limit=5)
    rec = wait(lambda: (r := bus(cfg).run("oom", 0)) and r["terminal"] and r, what="oom failed")
    assert rec["phase"] == "Failed" and rec["restarts"] == 2 and rec["reason"] == "BackoffLimitExceeded"
    from reconciler.render import render

    md = render(api.plan(cfg, time_limit=5).plan, "markdown", None)  # the PR comment says so too
    assert "> **Note:** job oom: Failed (BackoffLimitExceeded): replica 0: exit code 1 after 2 restart(s)" in md
    assert "> **Note:** job oom Failed (spec unchanged): it demands no capacity" in md
    api.apply(cfg, time_limit=5)  # frees its instance; status says why
    st = job_status(cfg, "oom")
    assert st["phase"] == "Failed" and st["run"]["restarts"] == 2
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Failed"]["status"] == "True" and conds["Failed"]["reason"] == "BackoffLimitExceeded"
    assert "CUDA error: out of memory" in conds["Failed"]["message"] and conds["Restarts"]["message"] == "2 restart(s)"
    assert st["run"]["lastLog"][-1] == "CUDA error: out of memory"
    assert live(cfg) == [] and not api.plan(cfg, time_limit=5).plan.has_changes


def test_a_killed_agent_is_a_lost_node_and_its_work_is_placed_again(rt, monkeypatch):
    cmd = [PY, "-c", "import time\nwhile True: print('tick', flush=True); time.sleep(0.2)"]
    cfg = config(rt / "c", job("svc", cpu=2, run={"command": cmd}, mode="service"))
    api.apply(cfg, time_limit=5)
    first = live(cfg)[0]
    wait(lambda: run_phase(cfg, "svc") == "Running", timeout=300, what="svc running")
    assert replicas_on(first)  # (what the end of this test checks is gone)
    pid = int((state_dir(cfg) / "sim" / "agents" / first / "agent.pid").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    # (stale after 5 s from here, not the fixture's 15: only the killed agent is judged before the replacement's apply,
    # and the 10 s less of waiting kept the CI tier, at 590-620 s on 2026-12-02, under its 10 minutes)
    monkeypatch.setenv("FLEETOPS_HEARTBEAT_STALE_SECONDS", "5")
    res = wait(lambda: (p := api.plan(cfg, time_limit=5)) and p.plan.deletes and p, timeout=300, what="stale heartbeat seen")
    assert [d.instance_id for d in res.plan.deletes] == [first]
    assert any(f"instance {first} is replaced: lost node" in n for n in res.plan.notes)
    api.apply(cfg, time_limit=5)
    assert first not in live(cfg) and len(live(cfg)) == 1
    second = live(cfg)[0]
    wait(lambda: (r := bus(cfg).run("svc", 0)) and r["instance"] == second and r["phase"] == "Running", timeout=300,
         what="svc running again")
    # Back within minutes of the kill (the heartbeat goes stale after 5 s here), even on a loaded machine: no figure
    # of speed, a bound on the waits above.
    assert time.monotonic() - killed < 600
    # The lost node's replica process went with its instance: SIGKILLed with it (a signal is delivered, not awaited:
    # on a loaded machine the process can still be listed for a moment after the kill).
    wait(lambda: not replicas_on(first), timeout=120, what=f"the replica processes of {first} gone")


def test_a_spot_interruption_checkpoints_and_the_replacement_resumes(rt):
    j = job("ft", cpu=2, run={"command": [PY, TRAIN, "100000", "0.05"]}, checkpoint={"dir": "/ckpt", "signal": "SIGTERM", "grace_seconds": 30})
    # A reservation beside it keeps a second instance, so the replacement's plan differs from the first
    # (a plan identical to an earlier one reuses its create keys: issue 15 makes them unique per launch).
    cfg = config(rt / "c", j, job("hold", cpu=15))
    api.apply(cfg, time_limit=5)
    rec = wait(lambda: (r := bus(cfg).run("ft", 0)) and any("step 5/" in ln for ln in r["log_tail"]) and r, what="ft past step 5")
    first = rec["instance"]
    SimCloud(state_dir(cfg)).interrupt(first)  # the notice first; returns once the agent has checkpointed and uploaded
    disk = state_dir(cfg) / "sim" / "disks"  # each instance's own: the checkpoint reaches the replacement through the backend
    old = disk / first / "checkpoints" / "ft" / "ckpt" / "rank-0.json"
    saved = int(old.read_text().split(":")[1].strip(" }"))
    [manifest] = (state_dir(cfg) / "checkpoints" / "ft" / "manifests").iterdir()  # uploaded before the notice was done
    doc = json.loads(manifest.read_text())
    assert doc["instance"] == first and [f["path"] for f in doc["files"]] == ["rank-0.json"]
    rec = bus(cfg).run("ft", 0)
    assert rec["phase"] == "Stopped" and rec["reason"] == "Interrupted" and any("checkpointed at step" in ln for ln in rec["log_tail"])
    assert bus(cfg).agent(first)["state"] == "Interrupting"
    api.apply(cfg, time_limit=5)
    second = api.plan(cfg, time_limit=5).observed.placements["ft"][0]
    assert second != first and second in live(cfg)
    rec = wait(lambda: (r := bus(cfg).run("ft", 0)) and r["instance"] == second and any("resuming" in ln for ln in r["log_tail"]) and r,
               what="replacement resumed")
    ckpt = disk / second / "checkpoints" / "ft" / "ckpt" / "rank-0.json"  # restored onto the replacement's disk
    assert any(f"resuming from checkpoint {ckpt} at step {saved}" in ln for ln in rec["log_tail"])


def test_without_checkpoint_sync_a_replica_moved_off_a_reclaimed_instance_starts_from_step_0(rt, monkeypatch):
    """The sim is as honest as a cloud: each instance has its own disk (`sim/disks/<instance>/checkpoints`), so with
    the copying through the state backend off, the replacement finds no checkpoint. (The sim's instances shared one
    volumes directory before, and a moved replica resumed there as it never would on a cloud.)"""
    monkeypatch.setenv("FLEETOPS_CHECKPOINT_SYNC", "0")  # (inherited by the sim's agents)
    j = job("ft", cpu=2, run={"command": [PY, TRAIN, "100000", "0.05"]}, checkpoint={"dir": "/ckpt", "signal": "SIGTERM", "grace_seconds": 30})
    cfg = config(rt / "c", j, job("hold", cpu=15))
    api.apply(cfg, time_limit=5)
    rec = wait(lambda: (r := bus(cfg).run("ft", 0)) and any("step 3/" in ln for ln in r["log_tail"]) and r, what="ft past step 3")
    first = rec["instance"]
    SimCloud(state_dir(cfg)).interrupt(first)
    assert (state_dir(cfg) / "sim" / "disks" / first / "checkpoints" / "ft" / "ckpt" / "rank-0.json").exists()
    api.apply(cfg, time_limit=5)
    second = api.plan(cfg, time_limit=5).observed.placements["ft"][0]
    assert second != first
    rec = wait(lambda: (r := bus(cfg).run("ft", 0)) and r["instance"] == second and any("step 1/" in ln for ln in r["log_tail"]) and r,
               what="the replacement's first step")
    assert not any("resuming" in ln for ln in rec["log_tail"]), rec["log_tail"]
    assert not (state_dir(cfg) / "checkpoints").exists()  # nothing copied


def test_an_agent_that_cannot_reach_the_bus_shows_agent_unreachable_never_running(rt, monkeypatch):
    monkeypatch.setenv("FLEETOPS_SIM_AGENTS", "0")  # no sim agent: this test starts its own, pointed at a dead bus
    monkeypatch.setenv("FLEETOPS_AGENT_BOOT_SECONDS", "1")
    cfg = config(rt / "c", job("train", cpu=2, run={"command": [PY, "-c", "import time; time.sleep(600)"]}))
    api.apply(cfg, time_limit=5)
    iid = live(cfg)[0]
    env = {**os.environ, "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_MAX_ATTEMPTS": "1", "AWS_EC2_METADATA_DISABLED": "true"}
    log = rt / "agent.log"
    with open(log, "wb") as out:
        agent = subprocess.Popen([PY, "-m", "reconciler.cli", "agent", iid, "--state", "s3://fleet/state", "--runtime", "process",
                                  "--workdir", str(rt / "w")], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait(lambda: "cannot reach the bus" in log.read_text(), what="the agent logs the unreachable bus")
        time.sleep(1.5)  # past the boot allowance
        view = api.plan(cfg, time_limit=5).observed.runtime
        run = view.jobs["train"]
        assert run.phase == "Unknown" and run.reason == "AgentUnreachable"
        assert dict((c[0], c[1]) for c in run.conditions)["AgentUnreachable"] is True
        assert f"{iid} (no heartbeat yet)" in run.message
        api.apply(cfg, time_limit=5)
        st = job_status(cfg, "train")
        assert st["phase"] == "Unknown" and {c["type"]: c["status"] for c in st["conditions"]}["Running"] == "False"
        assert agent.poll() is None  # it keeps trying; it does not crash
    finally:
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait()


def test_the_quickstart_runs_its_jobs_and_stays_converged(rt):
    """The README's first line, with the sim's agents: plan, apply, plan --detailed-exitcode exits 0,
    and the jobs with `run` really run (llm-pretrain, which has none, stays a reservation)."""
    from typer.testing import CliRunner

    from reconciler.cli import app
    from tests.fleetkit import copy_quickstart

    qs = copy_quickstart(rt)
    runner = CliRunner()
    out = runner.invoke(app, ["apply", str(qs), "--auto-approve", "--time-limit", "10"])
    assert out.exit_code == 0, out.output
    desired = api.validate(qs)
    running = [n for n, j in desired.jobs.items() if j.spec.run is not None]
    assert len(running) == 9 and desired.jobs["llm-pretrain"].spec.run is None
    wait(lambda: all(run_phase(qs, n) == "Running" for n in running), timeout=180, what="every quickstart job running")
    again = runner.invoke(app, ["plan", str(qs), "--detailed-exitcode", "--time-limit", "10"])
    assert again.exit_code == 0, again.output
    # With the agents alive (new heartbeats and log lines since), the same plan is read back, not solved again.
    beats = {i: a.get("heartbeat_at") for i, a in bus(qs).agents().items()}
    wait(lambda: all(bus(qs).agent(i).get("heartbeat_at") != b for i, b in beats.items()), what="a new heartbeat from every agent")
    third = runner.invoke(app, ["plan", str(qs), "--detailed-exitcode", "--time-limit", "10"])
    assert third.exit_code == 0 and "read back from .reconcile/cache/plan-memo.json" in third.stderr, third.output
    wait(lambda: any("step 1/150" in ln for ln in bus(qs).run("finetune-a", 0)["log_tail"]), what="finetune-a's first step")
    logs = runner.invoke(app, ["logs", str(qs), "finetune-a"])
    assert logs.exit_code == 0 and "finetune-a rank 0/1: step 1/150" in logs.output
    st = runner.invoke(app, ["status", str(qs)])
    assert "job finetune-a: Running" in st.output and "job llm-pretrain: Reserved (Placed: 2 replica(s) reserved on" in st.output
    assert " 9 jobs running, 1 reserved, 0 pending" in st.output.splitlines()[0]


def test_the_controller_replaces_an_interrupted_instance_and_exits_on_sigterm(rt):
    """`reconcile controller` as a process: it applies the config, then on an interruption notice the
    work is placed again (resumed from its checkpoint) without anyone running apply; SIGTERM ends it."""
    j = job("ft", cpu=2, run={"command": [PY, TRAIN, "100000", "0.05"]}, checkpoint={"dir": "/ckpt", "signal": "SIGTERM", "grace_seconds": 30})
    cfg = config(rt / "c", j, job("hold", cpu=15))
    log = rt / "controller.log"
    with open(log, "wb") as out:
        ctl = subprocess.Popen([PY, "-m", "reconciler.cli", "controller", str(cfg), "--poll", "0.5", "--resync", "5", "--time-limit", "5"],
                               stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    def logged(cond, what: str):  # (a wait that fails shows the controller's log: what it planned, and why instances went)
        try:
            return wait(cond, timeout=120, what=what)
        except AssertionError as e:
            raise AssertionError(f"{e}\ncontroller log:\n{log.read_text()}") from None

    try:
        # (on a live instance. Under load this test failed with "sim: no live instance": the controller, acting on the
        # notice, terminated the instance while SimCloud.interrupt still waited for the agent's checkpoint, and the
        # reclaim after the notice refused an instance already gone; it is now a reclaim of nothing, test_sim_store)
        live = lambda: {i["id"] for i in SimCloud(state_dir(cfg)).instances() if i["state"] == "running"}  # noqa: E731
        rec = logged(lambda: (r := bus(cfg).run("ft", 0)) and any("step 3/" in ln for ln in r["log_tail"]) and r["instance"] in live() and r,
                     what="ft running")
        first = rec["instance"]
        noticed = time.monotonic()
        SimCloud(state_dir(cfg)).interrupt(first)
        rec = logged(lambda: (r := bus(cfg).run("ft", 0)) and r["instance"] != first and any("resuming" in ln for ln in r["log_tail"]) and r,
                     what="ft resumed on a replacement")
        elapsed = time.monotonic() - noticed
        text = log.read_text()
        assert f"replace {first}: interruption notice" in text or "resync: plan" in text, text  # acted on the report (or on drift)
        print(f"interrupted work resumed {elapsed:.1f}s after the notice (target 30 s; shared machine)")
        ctl.send_signal(signal.SIGTERM)
        assert ctl.wait(timeout=60) == 0
        assert "stopped after" in log.read_text()
        assert not (state_dir(cfg) / "apply.lock").exists()
    finally:
        if ctl.poll() is None:
            os.killpg(ctl.pid, signal.SIGKILL)
            ctl.wait()


def test_a_gone_instances_heartbeat_is_cleaned_up_by_the_next_apply(rt):
    cfg = config(rt / "c", job("etl", cpu=2, run={"command": [PY, "-c", "print('ok')"]}))
    api.apply(cfg, time_limit=5)
    iid = live(cfg)[0]
    wait(lambda: (r := bus(cfg).run("etl", 0)) and r["terminal"], what="etl finished")
    assert bus(cfg).agent(iid) is not None
    api.apply(cfg, time_limit=5)  # deletes the instance (the job is done), and with it its heartbeat key
    assert live(cfg) == [] and bus(cfg).agent(iid) is None
    assert bus(cfg).run("etl", 0)["phase"] == "Succeeded"  # the run record stays: history


def test_an_agent_whose_sim_store_was_deleted_ends_with_its_replicas(rt):
    """Deleting a sim's store (a config copy removed with its .reconcile/) ends the instances it held: the
    agents and their replicas exit instead of running forever (they did: hundreds after a day of tests)."""
    import shutil

    cfg = config(rt / "c", job("serve", cpu=2, mode="service", run={"command": [PY, "-c", "import time; time.sleep(600)"]}))
    api.apply(cfg, time_limit=5)
    iid = live(cfg)[0]
    sim = SimCloud(state_dir(cfg))
    agent_pid = int((sim.agent_dir(iid) / "agent.pid").read_text().split()[0])
    wait(lambda: replicas_on(iid), what="the replica started")
    # (its agent writes there while it goes: a file it adds mid-removal left the directory not empty, as `rm -rf`
    # can; removed again until it is gone)
    wait(lambda: shutil.rmtree(state_dir(cfg), ignore_errors=True) or not state_dir(cfg).exists(), what="the store removed")

    def gone(pid: int) -> bool:
        try:
            return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            return True

    wait(lambda: gone(agent_pid), what="the agent exited")
    wait(lambda: not replicas_on(iid), what="its replica was ended")


def test_a_job_given_the_gpu_of_a_job_still_checkpointing_starts_only_once_it_has_exited(rt):
    """The audit's case on one fixed p4d: j3 (checkpointing for 2 s on SIGTERM) leaves and n2 comes in the same
    edit, on j3's GPU. n2's process starts only after j3's has exited (they overlapped before)."""
    from tests.test_runtime_agent import NOTED, notes_of

    notes = rt / "notes"

    def noted(name: str, **spec) -> dict:
        env = {"NOTES": str(notes), "TAG": name, "CHECKPOINT_SECONDS": "2"}
        return job(name, gpus=1, gpu_type="A100", cpu=2, mem=8, run={"command": [PY, "-c", NOTED], "env": env}, **spec)

    def gpu_of(name: str) -> str:
        return next(ln.split()[3] for ln in notes.read_text().splitlines() if ln.split()[:2] == [name, "start"])

    def p4d(*jobs: dict) -> Path:
        return write_config(rt / "c", [topology(), tenant("t"), pool("gpu", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], lo=1, hi=1), *jobs])

    ck = {"dir": "/ckpt", "signal": "SIGTERM", "grace_seconds": 30}
    jobs = [noted(f"j{i}", **({"checkpoint": ck} if i == 3 else {})) for i in range(1, 9)]
    cfg = p4d(*jobs)
    api.apply(cfg, time_limit=5)
    wait(lambda: len(notes_of(notes)) == 8 and notes_of(notes), what="j1..j8 started")
    p4d(*(j for j in jobs if j["metadata"]["name"] != "j3"), noted("n2"))
    api.apply(cfg, time_limit=5)
    n = wait(lambda: (x := notes_of(notes)) and ("n2", "start") in x and ("j3", "exit") in x and x, what="j3 exited and n2 started")
    assert gpu_of("n2") == gpu_of("j3")  # the GPU j3 released
    assert n["n2", "start"] >= n["j3", "exit"], n


def test_a_gang_whose_heal_fails_stops_its_survivor_and_never_runs_at_a_smaller_world_size(rt, monkeypatch):
    """Replica 0's instance is interrupted and its zone runs out, so the heal fails. Before, the survivor was
    reassigned alone and restarted as "RANK 0 WORLD 1" (assignment world_size 1) while status said the gang ran.
    A gang runs with all its replicas or none: the survivor is stopped and the gang is pending."""
    from reconciler.errors import ApplyError

    monkeypatch.setenv("FLEETOPS_SIM_NOTICE_SECONDS", "5")
    cmd = [PY, "-c", "import os, time; print('RANK', os.environ['RANK'], 'WORLD', os.environ['WORLD_SIZE'], flush=True); "
                     "time.sleep(600)"]
    cfg = config(rt / "c", job("gang", cpu=15, replicas=2, gang="zone", mode="service", run={"command": cmd}))
    api.apply(cfg, time_limit=5)
    for r in (0, 1):
        wait(lambda: (rec := bus(cfg).run("gang", r)) and "WORLD 2" in " ".join(rec["log_tail"]), what=f"gang/{r} running")
    lost, survivor = api.plan(cfg, time_limit=5).observed.placements["gang"]
    assert lost != survivor
    sim = SimCloud(state_dir(cfg))
    sim.interrupt(lost)
    sim.exhaust("us-east-1a")
    with pytest.raises(ApplyError):
        api.apply(cfg, time_limit=5)

    assert bus(cfg).assignments() == {}  # nothing assigned: the survivor is not restarted at world_size 1
    rec = wait(lambda: (r := bus(cfg).run("gang", 1)) and r["phase"] == "Stopped" and r, what="the survivor's replica stopped")
    assert (rec["instance"], rec["reason"]) == (survivor, "Unassigned"), rec
    wait(lambda: not replicas_on(survivor), what="the survivor's replica process gone")
    assert not any("WORLD 1" in line for r in (0, 1) for line in bus(cfg).run("gang", r)["log_tail"])
    st = job_status(cfg, "gang")
    assert st["phase"] == "Pending" and st["instances"] == [] and "all its replicas or none" in st["conditions"][0]["message"]


def test_a_replica_on_a_deleted_instance_gets_its_checkpoint_signal_and_grace(rt):
    """Deleting a sim instance SIGKILLed its agent and replicas at once, so a replica there never checkpointed
    (a cloud's termination shuts the OS down: the agent gets SIGTERM and stops its replicas with their signal).
    Now the replica writes its checkpoint and exits, and the apply that deleted the instance did not wait for it."""
    from tests.test_runtime_agent import NOTED, notes_of

    notes = rt / "notes"
    env = {"NOTES": str(notes), "TAG": "ft", "CHECKPOINT_SECONDS": "2"}
    ck = {"dir": "/ckpt", "signal": "SIGTERM", "grace_seconds": 30}
    cfg = config(rt / "c", job("ft", cpu=2, mode="service", run={"command": [PY, "-c", NOTED], "env": env}, checkpoint=ck))
    api.apply(cfg, time_limit=5)
    iid = live(cfg)[0]
    wait(lambda: ("ft", "start") in notes_of(notes), what="ft started")
    config(rt / "c")  # the job is removed: its instance is deleted
    began = time.monotonic()
    res = api.apply(cfg, time_limit=5)
    assert res.report.deleted == [iid] and iid not in live(cfg)
    assert time.monotonic() - began < 25  # apply did not sit out the 30 s grace
    n = wait(lambda: (x := notes_of(notes)) and ("ft", "exit") in x and x, timeout=60, what="ft checkpointed and exited")
    assert n["ft", "checkpointing"] < n["ft", "exit"] and n["ft", "exit"] - n["ft", "checkpointing"] >= 1.5, n
    wait(lambda: not replicas_on(iid), what=f"the replica processes of {iid} gone")


def test_a_replica_moved_off_a_deleted_instance_starts_anew_only_after_its_old_copy_checkpointed(rt):
    """The pool's instance type changes: apply creates the new instance, deletes the old one and moves the replica.
    The old copy checkpoints through its grace while the new instance's agent boots; the new copy starts only after
    the old one exited (reported as WaitingForPredecessor meanwhile), so the rank never runs twice. (Apply keeps the
    deleted instance's heartbeat while its agent still reports the replica: deleted with the instance, the new agent
    read the missing key as gone and started at once, 1 run in ~6 under load.) The old copy's checkpoint lasts until
    the new agent says it waits for it (the test's `release`): a fixed 2 s one was over before a loaded machine had
    booted the new agent, which then had nothing to wait for (2 runs in 10 beside two CPU hogs)."""
    from tests.test_runtime_agent import NOTED, notes_of

    notes, release = rt / "notes", rt / "release"
    checkpoint = 'time.sleep(float(os.environ["CHECKPOINT_SECONDS"]))'
    held = ('limit = time.time() + 25\n    while not os.path.exists(os.environ["RELEASE"]) and time.time() < limit:\n'
            '        time.sleep(0.05)')
    assert checkpoint in NOTED
    script = NOTED.replace("os.environ['TAG']", "os.environ['FLEETOPS_INSTANCE']").replace(checkpoint, held)  # each copy notes its instance
    ck = {"dir": "/ckpt", "signal": "SIGTERM", "grace_seconds": 30}
    spec = job("ft", cpu=2, mode="service", run={"command": [PY, "-c", script], "env": {"NOTES": str(notes), "RELEASE": str(release)}},
               checkpoint=ck)

    def on(itype: str) -> Path:
        return write_config(rt / "c", [topology(), tenant("t"), pool("cpu", "aws", "us-east-1", ["us-east-1a"], [itype], hi=4), spec])

    cfg = on("m6i.4xlarge")
    api.apply(cfg, time_limit=5)
    old = live(cfg)[0]
    wait(lambda: (old, "start") in notes_of(notes), what="ft started")
    res = api.apply(on("c6i.8xlarge"), time_limit=5)
    assert res.report.deleted == [old] and len(live(cfg)) == 1
    new = live(cfg)[0]
    log = SimCloud(state_dir(cfg)).agent_dir(new) / "agent.log"
    waiting = f"ft/0: waiting for its previous copy on {old} to stop"
    wait(lambda: log.exists() and waiting in log.read_text(), timeout=60, what="the new agent waiting for the old copy")
    release.touch()
    n = wait(lambda: (x := notes_of(notes)) and (old, "exit") in x and (new, "start") in x and x, timeout=60,
             what="the old copy exited and the new one started")
    assert n[new, "start"] >= n[old, "exit"], n


# A gang's training step in lockstep, as DDP's: each step ends in a collective (every rank's post of the step, in a
# shared directory the sim's local processes all see), which also reduces the stop flag over the ranks, so a rank
# signalled stops with the others at the same step (the usual SIGTERM handling of a DDP job). It checkpoints its
# step after each and says where it resumed from.
LOCKSTEP = r'''
import json, os, signal, sys, time
steps, delay = int(sys.argv[1]), float(sys.argv[2])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
sync, ckdir = os.environ["GANG_SYNC"], os.environ["FLEETOPS_CHECKPOINT_DIR"]
ckpt = os.path.join(ckdir, f"rank-{rank}.json")
flag = []
signal.signal(signal.SIGTERM, lambda s, f: flag.append(s))
os.makedirs(sync, exist_ok=True)
def put(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
step = 0
if os.path.exists(ckpt):
    with open(ckpt) as f:
        step = json.load(f)["step"]
print(f"rank {rank}: resuming at step {step}", flush=True)
while step < steps:
    time.sleep(delay)
    nxt = step + 1
    put(os.path.join(sync, f"{nxt}.{rank}"), "1" if flag else "0")
    posts = [os.path.join(sync, f"{nxt}.{r}") for r in range(world)]
    given_up = time.time() + 600
    while not all(os.path.exists(p) for p in posts):
        if time.time() > given_up:
            print(f"rank {rank}: collective of step {nxt} timed out", flush=True)
            sys.exit(1)
        time.sleep(0.02)
    step = nxt
    os.makedirs(ckdir, exist_ok=True)
    put(ckpt, json.dumps({"step": step}))
    print(f"rank {rank}: step {step}", flush=True)
    if any(open(p).read() == "1" for p in posts):
        print(f"rank {rank}: stop agreed, checkpointed at step {step}", flush=True)
        sys.exit(0)
print(f"rank {rank}: done", flush=True)
'''


def resumes(cfg: Path, name: str, replica: int, instance: str) -> list[int]:
    """The steps the replica's copies on `instance` said they resumed at, in order (its log there keeps every start)."""
    log = SimCloud(state_dir(cfg)).agent_dir(instance) / "logs" / f"{name}-{replica}.log"
    return [int(ln.rsplit(" ", 1)[1]) for ln in (log.read_text().splitlines() if log.exists() else []) if "resuming at step" in ln]


def resumed_after(cfg: Path, where: dict[int, str], apply) -> tuple[dict[int, str], dict[int, int]]:
    """Run `apply`, then wait for each replica's next start where the gang is placed then: (placement, resumed steps)."""
    before = {(i, r): len(resumes(cfg, "gang", r, i)) for i in where.values() for r in where}
    apply()
    now = dict(enumerate(api.plan(cfg, time_limit=5).observed.placements["gang"]))
    steps = {r: wait(lambda: (got := resumes(cfg, "gang", r, now[r])) and len(got) > before.get((now[r], r), 0) and [got[-1]],
                     timeout=120, what=f"gang/{r} resumed on {now[r]}")[0] for r in now}
    return now, steps


def test_a_gang_whose_instance_is_reclaimed_resumes_every_rank_at_the_same_step(rt):
    """A gang of 2, one rank per instance, training in lockstep. Rank 1's instance gets a spot notice: its rank stops
    and the other is signalled with it (GangStopped), both checkpoint at one step, and after the heal (rank 1 on a new
    instance, rank 0 staying) both resume there. Then rank 0's instance is reclaimed too: again one step for both.
    Before, the rank that stayed was never signalled; with a stop agreed over the ranks it exited 0 and was recorded
    Succeeded, and at the second move the instance that uploaded last carried rank 1's file of the first round, which
    the restore took over rank 1's own: rank 1 resumed at the first move's step, rank 0 at the second's."""
    sync = rt / "sync"
    ck = {"dir": "/ckpt", "signal": "SIGTERM", "grace_seconds": 5}
    spec = job("gang", cpu=15, replicas=2, gang="zone", run={"command": [PY, "-c", LOCKSTEP, "100000", "0.3"], "env": {"GANG_SYNC": str(sync)}},
               checkpoint=ck)
    cfg = config(rt / "c", spec)
    api.apply(cfg, time_limit=5)

    def moved(victim: int, past: int) -> dict[int, int]:
        where = dict(enumerate(api.plan(cfg, time_limit=5).observed.placements["gang"]))
        for r in (0, 1):
            wait(lambda: (rec := bus(cfg).run("gang", r)) and any(f"step {past}" in ln for ln in rec["log_tail"]), what=f"gang/{r} past step {past}")
        SimCloud(state_dir(cfg)).interrupt(where[victim])  # the notice first; returns once its agent has checkpointed
        stayed = where[1 - victim]
        rec = wait(lambda: (r := bus(cfg).run("gang", 1 - victim)) and r["phase"] != "Running" and r, what="the other rank stopped")
        # signalled at the same stop, not Succeeded (then waiting for the gang, by the next poll)
        assert rec["phase"] == "Starting" and rec["reason"] in ("GangStopped", "WaitingForGang"), rec
        stopped = {r: json.loads((SimCloud(state_dir(cfg)).disk_dir(where[r]) / "checkpoints" / "gang" / "ckpt" / f"rank-{r}.json").read_text())["step"]
                   for r in (0, 1)}
        assert stopped[0] == stopped[1], stopped  # one stop, one step
        now, steps = resumed_after(cfg, where, lambda: api.apply(cfg, time_limit=5))
        # (the heal may renumber: the instance that stayed can take the other rank, whose file it has from the last round)
        assert stayed in now.values() and len(set(now.values()) - set(where.values())) == 1, (where, now)
        assert steps == {0: stopped[0], 1: stopped[0]}, (steps, stopped)
        return steps

    first = moved(1, 5)
    second = moved(0, first[0] + 5)
    assert second[0] > first[0]

    # Then a node is lost: its agent and rank die with it, nothing uploaded. The rank that stays hangs in its next
    # collective and is killed at the end of its grace when the gang moves; its upload is a round without the lost
    # rank, which no one restores: both resume from the last complete round, the second move's step. Before, the new
    # copy took the survivor's upload, whose file of the lost rank was the one carried from that round, and the survivor
    # kept its own newer step.
    where = dict(enumerate(api.plan(cfg, time_limit=5).observed.placements["gang"]))
    for r in (0, 1):
        wait(lambda: (rec := bus(cfg).run("gang", r)) and any(f"step {second[0] + 5}" in ln for ln in rec["log_tail"]), what=f"gang/{r} past step {second[0] + 5}")
    sim = SimCloud(state_dir(cfg))
    sim.stop_agent(where[1])  # the node dies: agent and replica, no notice
    sim.interrupt(where[1])  # (no agent alive: no notice) and the cloud says it is gone
    now, steps = resumed_after(cfg, where, lambda: api.apply(cfg, time_limit=5))
    assert where[1] not in now.values() and where[0] in now.values(), (where, now)
    assert steps == {0: second[0], 1: second[0]}, (steps, second)


def controlled_gang(rt: Path, grace: float):
    """A 2-rank LOCKSTEP gang (one rank per instance) under the controller loop, which the test steps: (config, the
    controller's log lines, steps_until(cond, what, timeout, step): the controller stepped (with `step`) until `cond`
    holds, placed(): rank -> instance as the plan observes it)."""
    from reconciler.runtime.controller import Controller

    ck = {"dir": "/ckpt", "signal": "SIGTERM", "grace_seconds": grace}
    cfg = config(rt / "c", job("gang", cpu=15, replicas=2, gang="zone", checkpoint=ck,
                               run={"command": [PY, "-c", LOCKSTEP, "100000", "0.3"], "env": {"GANG_SYNC": str(rt / "sync")}}))
    logs: list[str] = []
    ctl = Controller(cfg, time_limit=5, poll=0.5, resync=600, log=logs.append)

    def steps_until(cond, what: str, timeout: float = 90.0, step: bool = True):
        limit = time.monotonic() + timeout
        while time.monotonic() < limit:
            if step:
                ctl.step()
            if out := cond():
                return out
            time.sleep(0.2)
        raise AssertionError(f"{what}: not within {timeout:g} s; controller said {logs}")

    def placed() -> dict[int, str]:
        return dict(enumerate(api.plan(cfg, time_limit=5).observed.placements.get("gang", [])))

    return cfg, logs, steps_until, placed


def test_the_controller_heals_a_gang_whose_ranks_get_spot_notices_and_both_ranks_resume_from_one_round(rt):
    """The controller loop, not a manual apply, handles a spot notice on one rank of a 2-rank gang: the rank's agent
    checkpoints on the notice and its peer stops with it (GangStopped), both at one step; the controller sees the
    instance Interrupting, then gone, and places the rank anew; both ranks resume at the step they stopped at. Then the
    same for rank 0, the master (the new rank 0 has another address)."""
    import threading

    cfg, logs, steps_until, placed = controlled_gang(rt, grace=5)

    def reclaimed(victim: int, past: int) -> int:
        steps_until(lambda: all((r := bus(cfg).run("gang", i)) and any(f"step {past}" in ln for ln in r["log_tail"]) for i in (0, 1)),
                    f"the gang trained past step {past}")
        where = placed()
        before = {(i, r): len(resumes(cfg, "gang", r, i)) for i in where.values() for r in where}
        sim = SimCloud(state_dir(cfg))
        reclaim = threading.Thread(target=sim.interrupt, args=(where[victim],))  # returns once the victim's agent checkpointed
        reclaim.start()
        try:
            # (signalled with the victim's stop; the controller may heal the gang before a record of it is read here)
            log = sim.agent_dir(where[1 - victim]) / "agent.log"
            steps_until(lambda: f"gang/{1 - victim}: stopping (GangStopped)" in log.read_text(), "the other rank stopped with it")
            now = steps_until(lambda: len(p := placed()) == 2 and where[victim] not in p.values() and p, "the gang placed anew")
        finally:
            reclaim.join(timeout=120)
        stopped = {r: json.loads((sim.disk_dir(where[r]) / "checkpoints" / "gang" / "ckpt" / f"rank-{r}.json").read_text())["step"]
                   for r in (0, 1)}
        assert stopped[0] == stopped[1] >= past, stopped  # one stop, one step
        steps = steps_until(lambda: all(len(resumes(cfg, "gang", r, now[r])) > before.get((now[r], r), 0) for r in (0, 1))
                            and {r: resumes(cfg, "gang", r, now[r])[-1] for r in (0, 1)}, "both ranks resumed")
        assert steps == {0: stopped[0], 1: stopped[0]}, (steps, stopped, logs)
        assert any(m.startswith(f"replace {where[victim]}") for m in logs), logs
        return stopped[0]

    first = reclaimed(1, 3)
    assert reclaimed(0, first + 3) > first


def test_a_gang_whose_node_is_lost_stops_its_survivor_before_the_controller_heals_it(rt, monkeypatch):
    """A 2-rank lockstep gang under the controller loop. Rank 1's spot reclaim first makes a complete round (both at one
    step). Then rank 1's node is lost: its agent and rank killed, no notice, its instance still listed. Rank 0 hangs in
    its next collective. Before the controller acts (it is not stepped), rank 0's agent sees rank 1's agent no longer
    alive by the stale limit (4 s here) and stops rank 0 with its checkpoint signal (GangPeerLost), killed at the end of
    its grace (hung), and it waits. Before, it hung until an apply moved the gang. Then the controller replaces the lost
    node and both ranks resume from the newest complete round, the reclaim's."""
    import threading

    monkeypatch.setenv("FLEETOPS_HEARTBEAT_STALE_SECONDS", "4")
    cfg, logs, steps_until, placed = controlled_gang(rt, grace=3)
    sim = SimCloud(state_dir(cfg))

    def past(step: int) -> bool:
        return all((r := bus(cfg).run("gang", i)) and any(f"step {step}" in ln for ln in r["log_tail"]) for i in (0, 1))

    steps_until(lambda: past(2), "the gang trained past step 2")
    where = placed()
    reclaim = threading.Thread(target=sim.interrupt, args=(where[1],))
    reclaim.start()
    try:
        now = steps_until(lambda: len(p := placed()) == 2 and where[1] not in p.values() and p, "the gang placed anew")
    finally:
        reclaim.join(timeout=120)
    rnd = json.loads((sim.disk_dir(where[0]) / "checkpoints" / "gang" / "ckpt" / "rank-0.json").read_text())["step"]
    steps_until(lambda: all(resumes(cfg, "gang", r, now[r]) for r in (0, 1)) and past(rnd + 3), f"the gang past step {rnd + 3}")

    survivor, lost = now[0], now[1]
    before = {(i, r): len(resumes(cfg, "gang", r, i)) for i in now.values() for r in (0, 1)}
    sim.stop_agent(lost)  # the node dies: its agent and rank, no notice; the cloud still lists it
    log = sim.agent_dir(survivor) / "agent.log"
    rec = steps_until(lambda: "gang/0: stopping (GangPeerLost)" in log.read_text() and (r := bus(cfg).run("gang", 0))
                      and r["reason"] == "WaitingForGang" and r, "rank 0 stopped for its lost peer", timeout=60, step=False)  # before: hung
    assert f"replica 1's agent on {lost} is lost" in rec["message"] and rec["epoch"] == bus(cfg).run("gang", 1)["epoch"], rec
    steps_until(lambda: not replicas_on(survivor), "rank 0's process gone", timeout=30, step=False)
    healed = steps_until(lambda: len(p := placed()) == 2 and lost not in p.values() and p, "the lost node replaced")
    assert any(m.startswith(f"replace {lost}: lost node") for m in logs), logs
    steps = steps_until(lambda: all(len(resumes(cfg, "gang", r, healed[r])) > before.get((healed[r], r), 0) for r in (0, 1))
                        and {r: resumes(cfg, "gang", r, healed[r])[-1] for r in (0, 1)}, "both ranks resumed")
    assert steps == {0: rnd, 1: rnd}, (steps, rnd, logs)  # the round without rank 1 is never restored


def test_the_quickstart_train_py_resumes_a_gangs_ranks_at_one_step(tmp_path):
    """The quickstart's train.py steps each rank on its own: at one stop its ranks hold different steps (measured on the
    sim: rank 0 at 19, rank 1 at 7), and each resumed from its own. Given the round (every rank's file on every
    instance), each rank now resumes from the lowest; a job of one replica from its own."""
    ck = tmp_path / "ckpt"
    ck.mkdir()
    (ck / "rank-0.json").write_text(json.dumps({"step": 19}))
    (ck / "rank-1.json").write_text(json.dumps({"step": 7}))

    def resumed(rank: int, world: int) -> str:
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "FLEETOPS_CHECKPOINT_DIR": str(ck), "FLEETOPS_JOB": "g"}
        out = subprocess.run([PY, TRAIN, "0"], env=env, capture_output=True, text=True, timeout=60)
        return next(ln for ln in out.stdout.splitlines() if "resuming" in ln)

    assert resumed(0, 2) == f"g rank 0: resuming from checkpoint {ck / 'rank-0.json'} at step 7 (the gang's lowest, rank 1's; this rank's own is at 19)"
    assert resumed(1, 2) == f"g rank 1: resuming from checkpoint {ck / 'rank-1.json'} at step 7"
    assert resumed(0, 1).endswith("at step 19")


@pytest.mark.parametrize("plant", ["dir", "garbage"])
def test_stop_agents_says_which_record_it_could_not_read_and_exits_1(tmp_path, plant):
    """`sim stop-agents` said 'agents stopped' when an agent's pid record could not be read: its agent and replicas
    kept running, unnamed."""
    from typer.testing import CliRunner

    from reconciler.cli import app

    d = tmp_path / ".reconcile" / "sim" / "agents" / "sim-aws-00001"
    d.mkdir(parents=True)
    if plant == "dir":
        (d / "agent.pid").mkdir()
    else:
        (d / "replicas.pids").write_text("12x 99\n")
    out = CliRunner().invoke(app, ["sim", "stop-agents", str(tmp_path)])
    assert out.exit_code == 1 and "agents stopped" not in out.stdout, out.output
    assert str(d / ("agent.pid" if plant == "dir" else "replicas.pids")) in out.stderr, out.stderr


# A replica that ignores its checkpoint signal and leaves behind, outside its process group and with an emptied
# environment, a process of its own (a data server that daemonised): neither the group's kill nor the mark finds it.
STUBBORN = r'''
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True, env={})
with open(os.environ["STRAY_PID"], "w") as f:
    f.write(str(p.pid))
while True:
    time.sleep(0.2)
'''


def proc_alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_a_reclaim_ends_every_process_of_the_instance_and_the_replacement_resumes_from_the_upload(rt):
    """A spot reclaim is the VM's end: once the notice is over nothing of the instance runs, also a replica still in
    its grace and what it left outside its process group with its environment cleared (the sim killed the recorded
    process groups only, and such a process ran on after its instance was gone, holding what it held). The replica
    that checkpointed within the notice resumes on the replacement from its upload."""
    stray_file = rt / "stray.pid"
    ft = job("ft", cpu=2, run={"command": [PY, TRAIN, "100000", "0.05"]}, checkpoint={"dir": "/ckpt", "signal": "SIGTERM", "grace_seconds": 30})
    stubborn = job("stubborn", cpu=2, mode="service", run={"command": [PY, "-c", STUBBORN], "env": {"STRAY_PID": str(stray_file)}},
                   checkpoint={"dir": "/ckpt", "signal": "SIGTERM", "grace_seconds": 120})
    cfg = config(rt / "c", ft, stubborn, job("hold", cpu=11))
    api.apply(cfg, time_limit=5)
    [first] = live(cfg)
    wait(lambda: (r := bus(cfg).run("ft", 0)) and any("step 3/" in ln for ln in r["log_tail"]), what="ft past step 3")
    wait(lambda: stray_file.exists() and stray_file.read_text(), what="the stray started")
    sim = SimCloud(state_dir(cfg))
    d = sim.agent_dir(first)
    agent_pid = int((d / "agent.pid").read_text().split()[0])
    shims = [int(ln.split()[0]) for ln in (d / "replicas.pids").read_text().splitlines()]
    stray = int(stray_file.read_text())
    out = sim.interrupt(first, notice_seconds=8)  # stubborn outlasts the notice: killed with its instance
    assert out["checkpointed"] is False and out["notice"] == "ran out"
    everything = [agent_pid, *shims, stray, *replicas_on(first)]
    wait(lambda: not [p for p in everything if proc_alive(p)], timeout=10, what=f"every process of {first} gone")
    assert not replicas_on(first)
    api.apply(cfg, time_limit=5)
    second = api.plan(cfg, time_limit=5).observed.placements["ft"][0]
    assert second != first and second in live(cfg)
    [manifest] = (state_dir(cfg) / "checkpoints" / "ft" / "manifests").iterdir()
    saved = json.loads(manifest.read_text())
    assert saved["instance"] == first
    rec = wait(lambda: (r := bus(cfg).run("ft", 0)) and r["instance"] == second and any("resuming" in ln for ln in r["log_tail"]) and r,
               what="ft resumed on the replacement")
    old = (state_dir(cfg) / "sim" / "disks" / first / "checkpoints" / "ft" / "ckpt" / "rank-0.json").read_text()
    step = int(old.split(":")[1].strip(" }"))
    assert any(f"at step {step}" in ln for ln in rec["log_tail"]), rec["log_tail"]


def test_sim_interrupt_warns_when_a_record_of_what_the_instance_runs_could_not_be_read(tmp_path):
    """The reclaim ends what the instance's records name; one that cannot be read may name a process still running. `sim
    interrupt` said only 'interrupted' (the reclaim's problems were dropped), as `sim stop-agents` once did."""
    from typer.testing import CliRunner

    from reconciler.cli import app

    sim = SimCloud(tmp_path / ".reconcile")
    iid = sim.plant("aws", "us-east-1", "us-east-1a", "m6i.4xlarge", {})
    d = sim.agent_dir(iid)
    d.mkdir(parents=True)
    (d / "replicas.pids").write_text("12x 99\n")
    out = CliRunner().invoke(app, ["sim", "interrupt", iid, str(tmp_path)])
    assert out.exit_code == 0 and f"interrupted {iid}" in out.stdout, out.output
    assert "warning: " in out.stderr and str(d / "replicas.pids") in out.stderr, out.stderr


def test_a_reclaim_ends_what_is_left_in_the_group_of_a_replica_whose_shim_died_before(tmp_path):
    """A replica's shim was killed on its own (the OOM killer) and its command ran on in the shim's process group, its
    environment cleared: the reclaim killed the group only through its leader's pid, gone, so it skipped the group and
    the command outlived its instance. A group whose recorded leader is gone is still that replica's (no pid is reused
    while its group has a member)."""
    from providers.pids import start_time

    sim = SimCloud(tmp_path / ".reconcile")
    iid = sim.plant("aws", "us-east-1", "us-east-1a", "m6i.4xlarge", {})
    d = sim.agent_dir(iid)
    d.mkdir(parents=True)
    ready = tmp_path / "member.pid"
    leader = subprocess.Popen([PY, "-c", "import os, subprocess, sys, time\n"
                               f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], env={{}})\n"
                               f"open({str(ready)!r}, 'w').write(str(p.pid))\n"
                               "time.sleep(120)"], start_new_session=True)
    poll_until(lambda: ready.exists() and ready.read_text(), "the group's member running", 20)
    member = int(ready.read_text())
    (d / "replicas.pids").write_text(f"{leader.pid} {start_time(leader.pid)}\n")
    leader.kill()
    leader.wait()  # the shim gone, reaped; its command runs on in its group
    assert os.getpgid(member) == leader.pid
    try:
        assert sim.stop_agent(iid) == []
        poll_until(lambda: not (Path("/proc") / str(member)).exists() or
                   (Path("/proc") / str(member) / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", "the member killed", 5)
    finally:
        try:
            os.kill(member, signal.SIGKILL)
        except ProcessLookupError:
            pass
