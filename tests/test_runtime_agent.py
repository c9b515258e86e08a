"""The node agent with real replica processes on a real (local) bus: restarts and backoff, a gang
that meets over TCP, time limits, services, start errors, and the docker runtime's command line."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from reconciler.backend import LocalBackend, backend_for
from reconciler.errors import ReconcileError
from reconciler.runtime.agent import Agent
from reconciler.runtime.bus import Bus
from reconciler.runtime.runtimes import DockerRuntime, Launch, ProcessRuntime, docker_command

PY = sys.executable
# A replica that says it is ready, then on SIGTERM writes its checkpoint and exits 0.
CHECKPOINTER = [PY, "-c", "import os, signal, sys, time\n"
                          "def stop(s, f):\n"
                          "    open(os.path.join(os.environ['FLEETOPS_CHECKPOINT_DIR'], 'model.bin'), 'w').write('step 7')\n"
                          "    sys.exit(0)\n"
                          "signal.signal(signal.SIGTERM, stop)\n"
                          "print('ready', flush=True)\n"
                          "time.sleep(600)"]


def entry(job: str, command: list[str], replica: int = 0, world: int = 1, master: str = "i-0", **kw) -> dict:
    e = {"job": job, "replica": replica, "world_size": world, "local_rank": 0, "epoch": 1, "spec_hash": "h1",
         "run": {"command": command, "env": kw.pop("env", {})}, "mode": "batch", "restart": {"policy": "OnFailure", "backoff_limit": 2},
         "time_limit_hours": None, "checkpoint": None, "gpus": [], "master_instance": master, "master_port": 29500}
    e.update(kw)
    return e


@pytest.fixture
def bus(tmp_path):
    return Bus(backend_for(tmp_path, None))


@pytest.fixture
def agents(tmp_path, bus):
    made: list[Agent] = []

    def make(instance: str, **kw) -> Agent:
        a = Agent(instance, bus, ProcessRuntime(), tmp_path / instance, address="127.0.0.1", poll=0.05, heartbeat=0.2, backoff=0.05,
                  log=lambda m: None, **kw)
        made.append(a)
        return a

    yield make
    for a in made:  # never leave a replica process behind (an agent a test killed has none left: it forgot them)
        for rep in a.replicas.values():
            if rep.handle is not None:
                a.runtime.kill(rep.handle)


CK = {"dir": "/ckpt", "signal": "SIGTERM", "grace_seconds": 30}


class FailingCheckpointReads(LocalBackend):
    """The real local backend whose reads under `prefix` fail while `failing` (a network error, throttling, a
    missing permission), as a remote store's do."""

    failing, prefix = True, "checkpoints/"

    def _check(self, key: str) -> None:
        if self.failing and key.startswith(self.prefix):
            raise ReconcileError(f"s3: cannot read {key}: connection reset by peer")

    def list_keys(self, prefix: str) -> list[str]:
        self._check(prefix)
        return super().list_keys(prefix)

    def read_key(self, key: str) -> bytes | None:
        self._check(key)
        return super().read_key(key)

    def read_file(self, key: str, dest: Path, progress=None) -> bool:
        self._check(key)
        return super().read_file(key, dest, progress)


class FailingCheckpointWrites(LocalBackend):
    """The real local backend whose writes under checkpoints/ fail while `failing` (a network blip)."""

    failing = True

    def write_file(self, key: str, path: Path, progress=None) -> None:
        if self.failing and key.startswith("checkpoints/"):
            raise ReconcileError(f"s3: cannot write {key}: connection reset by peer")
        super().write_file(key, path, progress)


def test_a_checkpoint_upload_the_bus_fails_is_tried_again_within_its_time_and_the_replica_listed_till_it_is_done(tmp_path):
    """A spot notice: the replica checkpoints and exits; the first upload fails (the bus blips). The upload was dropped
    at once, logged, with most of the notice left: the replacement resumed from an older upload, or from step 0, and
    the agent said the notice was handled (the sim took that as "checkpointed"). Now it is tried again each poll until
    its deadline (the grace's end, or 10 s after the exit), the replica is listed in the heartbeat meanwhile (a moved
    copy waits for that), and the notice is handled once it is uploaded."""
    from reconciler.runtime import checkpoints
    from reconciler.runtime.notices import FileNotice

    store = FailingCheckpointWrites(tmp_path)
    bus = Bus(store)
    notice = tmp_path / "notice.json"
    cmd = CHECKPOINTER
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("ft", cmd, checkpoint=CK, mode="service")]})
    a = Agent("i-0", bus, ProcessRuntime(), tmp_path / "i-0", address="127.0.0.1", poll=0.05, heartbeat=0.2, backoff=0.1,
              checkpoint_root=tmp_path / "i-0" / "disk", log=lambda m: None, checkpoint_sync=True, notice=FileNotice(notice))
    try:
        run_until([a], lambda: (r := bus.run("ft", 0)) and r["log_tail"][-1:] == ["ready"])
        notice.write_text(json.dumps({"reason": "spot-interruption", "time": "now"}))
        run_until([a], lambda: (r := bus.run("ft", 0)) and r["phase"] == "Stopped")
        for _ in range(5):
            a.tick()
            time.sleep(0.05)
        assert not a.notice_done and "ft/0" in bus.agent("i-0")["running"]  # before: handled, with nothing uploaded
        store.failing = False
        run_until([a], lambda: a.notice_done)
        [doc] = checkpoints.manifests(store, "ft", log=lambda m: None)
        assert [f["path"] for f in doc["files"]] == ["model.bin"], doc
        assert bus.agent("i-0")["running"] == []
    finally:
        for rep in a.replicas.values():
            if rep.handle is not None:
                a.runtime.kill(rep.handle)


def test_a_replica_whose_checkpoint_cannot_be_read_from_the_bus_waits_instead_of_starting_afresh(tmp_path):
    """A replica moved to a new instance (an empty directory) while the state backend fails its reads: the agent
    logged "checkpoint not restored" and started it from step 0, and its next upload, newer, buried the upload it
    should have resumed from (three kept: a few such stops and the training was gone). Now it waits (Starting,
    CheckpointNotRestored, naming the error), tried again after the restart delays, and resumes once the read works."""
    from reconciler.runtime import checkpoints

    store = FailingCheckpointReads(tmp_path)
    bus = Bus(store)
    src = tmp_path / "elsewhere" / "ckpt"
    src.mkdir(parents=True)
    (src / "model.bin").write_bytes(b"7" * 5000)
    store.failing = False
    checkpoints.upload(store, "ft", src, instance="i-9", spec_hash="h1", epoch=1, log=lambda m: None)
    store.failing = True
    cmd = [PY, "-c", "import os,time; p=os.path.join(os.environ['FLEETOPS_CHECKPOINT_DIR'], 'model.bin'); "
                     "print('found', os.path.getsize(p) if os.path.exists(p) else None, flush=True); time.sleep(600)"]
    bus.put_assignment("i-0", {"serial": 2, "replicas": [entry("ft", cmd, epoch=2, checkpoint=CK, mode="service")]})
    a = Agent("i-0", bus, ProcessRuntime(), tmp_path / "i-0", address="127.0.0.1", poll=0.05, heartbeat=0.2, backoff=0.1,
              checkpoint_root=tmp_path / "i-0" / "disk", log=lambda m: None, checkpoint_sync=True)
    try:
        rec = run_until([a], lambda: (r := bus.run("ft", 0)) and r["reason"] != "Assigned" and r)
        assert (rec["phase"], rec["reason"]) == ("Starting", "CheckpointNotRestored") and not a.replicas["ft", 0].running, rec
        assert "connection reset by peer" in rec["message"], rec
        store.failing = False
        rec = run_until([a], lambda: (r := bus.run("ft", 0)) and "found 5000" in r["log_tail"] and r)
        assert rec["phase"] == "Running", rec
    finally:
        for rep in a.replicas.values():
            if rep.handle is not None:
                a.runtime.kill(rep.handle)


@pytest.fixture
def ck_agents(tmp_path, agents):
    """Agents that copy checkpoints through the bus, each instance with its own disk (tmp_path/INSTANCE/disk)."""
    return lambda instance: agents(instance, checkpoint_root=tmp_path / instance / "disk", checkpoint_sync=True)


def run_until(agents: list[Agent], done, timeout: float = 60.0):
    limit = time.monotonic() + timeout
    while time.monotonic() < limit:
        for a in agents:
            a.tick()
        out = done()
        if out:
            return out
        time.sleep(0.05)
    raise AssertionError(f"condition not met in {timeout}s")


def terminal(bus: Bus, job: str, replica: int = 0):
    return lambda: (r := bus.run(job, replica)) is not None and r["terminal"] and r


def test_a_failing_command_restarts_backoff_limit_times_then_fails_with_its_last_lines(bus, agents):
    cmd = [PY, "-c", "import os,sys; print('epoch loss nan at attempt', os.environ['FLEETOPS_ATTEMPT']); sys.exit(3)"]
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("train", cmd)]})
    a = agents("i-0")
    rec = run_until([a], terminal(bus, "train"))
    assert rec["phase"] == "Failed" and rec["reason"] == "BackoffLimitExceeded"
    assert rec["restarts"] == 2 and rec["exit_code"] == 3
    assert "exit code 3 after 2 restart(s)" in rec["message"] and "loss nan at attempt 2" in rec["message"]
    assert rec["log_tail"] == [f"epoch loss nan at attempt {n}" for n in range(3)]
    # Three attempts ran, each logged, and nothing runs any more.
    assert Path(rec["log_path"]).read_text().count("--- fleetops: attempt") == 3
    assert not any(r.running for r in a.replicas.values())


def test_restart_never_fails_at_the_first_failure(bus, agents):
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("once", [PY, "-c", "raise SystemExit(1)"], restart={"policy": "Never", "backoff_limit": 5})]})
    rec = run_until([agents("i-0")], terminal(bus, "once"))
    assert (rec["phase"], rec["reason"], rec["restarts"]) == ("Failed", "Error", 0)


def test_a_command_that_does_not_exist_fails_at_once_with_a_clear_reason(bus, agents):
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("typo", ["pyhton3", "train.py"])]})
    rec = run_until([agents("i-0")], terminal(bus, "typo"))
    assert rec["phase"] == "Failed" and rec["reason"] == "StartError" and rec["restarts"] == 0
    assert "command 'pyhton3' not found" in rec["message"]


def test_a_replica_past_its_time_limit_is_stopped_deadline_exceeded(bus, agents):
    cmd = [PY, "-c", "import time\nwhile True: time.sleep(0.05)"]
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("long", cmd, time_limit_hours=1 / 3600)]})  # one second
    rec = run_until([agents("i-0")], terminal(bus, "long"))
    assert rec["phase"] == "Failed" and rec["reason"] == "DeadlineExceeded" and rec["restarts"] == 0
    assert rec["exit_code"] is not None and rec["exit_code"] < 0  # stopped by a signal, not by itself


def test_a_service_is_restarted_whenever_it_exits(bus, agents):
    cmd = [PY, "-c", "print('serving'); raise SystemExit(0)"]
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("api", cmd, mode="service", restart={"policy": "OnFailure", "backoff_limit": 0})]})
    a = agents("i-0")
    rec = run_until([a], lambda: (r := bus.run("api", 0)) is not None and r["restarts"] >= 3 and r)
    assert not rec["terminal"] and rec["phase"] in ("Starting", "Running")
    assert rec["log_tail"].count("serving") >= 3


def test_a_restarted_agent_keeps_a_services_restart_backoff(bus, tmp_path):
    """A crashing service backs off between restarts (exponentially, up to 300 s). Its agent restarted (a crash, or
    systemd) read the run record's attempt but not the wait, and started it again at once: a crash loop as fast as
    the agent restarts. The wait's end is in the run record (next_start_at) and the new agent keeps it."""
    cmd = [PY, "-c", "raise SystemExit(3)"]
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("api", cmd, mode="service")]})

    def agent() -> Agent:
        return Agent("i-0", bus, ProcessRuntime(), tmp_path / "i-0", address="127.0.0.1", poll=0.05, heartbeat=0.2, backoff=30,
                     log=lambda m: None)

    first = agent()
    rec = run_until([first], lambda: (r := bus.run("api", 0)) is not None and r["reason"] == "BackOff" and r)
    assert rec["attempt"] == 1, rec
    second = agent()  # the first one is gone (nothing of it runs: its replica exited)
    limit = time.monotonic() + 1.5
    while time.monotonic() < limit:
        second.tick()
        time.sleep(0.05)
    rec = bus.run("api", 0)
    assert rec["attempt"] == 1 and rec["reason"] == "BackOff" and not second.replicas[("api", 0)].running, rec  # before: started again
    assert rec["next_start_at"] > time.time() + 20, rec  # the first agent's wait of 30 s, not a new one


def test_a_service_that_ran_long_before_it_crashed_restarts_after_the_first_delay_not_the_doubled_one(bus, tmp_path):
    """Restart delays double while a replica crash-loops, up to 5 minutes. They never started over: a service that
    crashed six times in a month, each after days of work, waited the 5-minute cap after the sixth. A replica that ran
    `backoff_reset` (10 minutes; here 0.5 s) before it failed now starts the doubling over, as the kubelet does."""
    script = tmp_path / "svc.py"
    script.write_text("import os, sys, time\n"
                      "time.sleep(0.8 if int(os.environ['FLEETOPS_ATTEMPT']) == 3 else 0)\n"  # the fourth run lasts
                      "sys.exit(3)\n")
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("api", [PY, str(script)], mode="service")]})
    a = Agent("i-0", bus, ProcessRuntime(), tmp_path / "i-0", address="127.0.0.1", poll=0.02, heartbeat=0.1, backoff=0.1,
              backoff_reset=0.5, log=lambda m: None)
    try:
        delays = {}
        for attempt in range(1, 5):  # the delay before attempt 1, 2, 3 (after quick crashes), then 4 (after a long run)
            rec = run_until([a], lambda n=attempt: (r := bus.run("api", 0)) is not None and r["reason"] == "BackOff"
                            and r["attempt"] == n and r, timeout=30)
            delays[attempt] = rec["message"].rsplit(" in ", 1)[1]
        assert delays == {1: "0.1s", 2: "0.2s", 3: "0.4s", 4: "0.1s"}, delays  # before: 4 -> 0.8s
        assert bus.run("api", 0)["backoff_from"] == 3
    finally:
        for rep in a.replicas.values():
            if rep.handle is not None:
                a.runtime.kill(rep.handle)


GANG = r'''
import os, socket, sys, time, json
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
attempt = int(os.environ["FLEETOPS_ATTEMPT"])
print(json.dumps({k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "FLEETOPS_JOB", "FLEETOPS_REPLICA")}), flush=True)
if rank == 1 and attempt == 0:
    sys.exit(7)  # the first attempt of replica 1 fails: the whole gang must restart
if rank == 0:
    srv = socket.create_server((addr, port))
    srv.settimeout(60)
    conn, _ = srv.accept()
    print("rank 0 got", conn.recv(64).decode(), flush=True)
    conn.sendall(b"ok")
else:
    for _ in range(600):
        try:
            s = socket.create_connection((addr, port), timeout=2)
            break
        except OSError:
            time.sleep(0.1)
    s.sendall(f"hello from rank {rank}".encode())
    print("rank 1 got", s.recv(64).decode(), flush=True)
'''


def test_a_two_replica_gang_meets_over_tcp_and_restarts_together(bus, agents, free_port):
    cmd = [PY, "-c", GANG]
    for i in (0, 1):
        bus.put_assignment(f"i-{i}", {"serial": 1, "replicas": [entry("gang", cmd, replica=i, world=2, master="i-0", master_port=free_port)]})
    a0, a1 = agents("i-0"), agents("i-1")
    run_until([a0, a1], lambda: all((r := bus.run("gang", i)) and r["terminal"] for i in (0, 1)), timeout=90)
    r0, r1 = bus.run("gang", 0), bus.run("gang", 1)
    assert r0["phase"] == r1["phase"] == "Succeeded", (r0, r1)
    assert r0["attempt"] == r1["attempt"] == 1  # replica 1 failed at attempt 0: both ran again
    assert "rank 0 got hello from rank 1" in r0["log_tail"] and "rank 1 got ok" in r1["log_tail"]
    env0 = [json.loads(x) for x in r0["log_tail"] if x.startswith("{")][-1]
    env1 = [json.loads(x) for x in r1["log_tail"] if x.startswith("{")][-1]
    assert (env0["RANK"], env1["RANK"]) == ("0", "1")
    assert env0["WORLD_SIZE"] == env1["WORLD_SIZE"] == "2" and env0["LOCAL_RANK"] == env1["LOCAL_RANK"] == "0"
    assert env0["MASTER_ADDR"] == env1["MASTER_ADDR"] == "127.0.0.1" and env0["MASTER_PORT"] == env1["MASTER_PORT"] == str(free_port)
    assert env0["FLEETOPS_JOB"] == "gang" and env1["FLEETOPS_REPLICA"] == "1"


def test_gpu_indices_and_the_users_env_reach_the_command(bus, agents):
    cmd = [PY, "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['NVIDIA_VISIBLE_DEVICES'], os.environ['WANDB_MODE'])"]
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("gpu", cmd, gpus=["2", "3"], env={"WANDB_MODE": "offline", "RANK": "99"})]})
    rec = run_until([agents("i-0")], terminal(bus, "gpu"))
    assert rec["phase"] == "Succeeded" and rec["log_tail"] == ["2,3 2,3 offline"]


def test_a_replica_gets_none_of_the_operators_credentials_but_its_own_env(bus, agents, monkeypatch):
    """The process runtime (the sim's instances) started a replica with the whole environment of the agent, which the
    sim starts from `reconcile apply`'s: the operator's AWS_SECRET_ACCESS_KEY, GITHUB_TOKEN, AZURE_CLIENT_SECRET... A
    job that printed its environment put them in its log tail, hence in apply's output, `reconcile status` and the
    status/ files a workflow commits (secrets audit). A container on a cloud instance gets only run.env; so does a
    process replica now, beside the rest of the environment. A credential the job names in run.env is its own."""
    planted = {"AWS_SECRET_ACCESS_KEY": "PLANTED-aws", "AWS_SESSION_TOKEN": "PLANTED-st", "GITHUB_TOKEN": "PLANTED-gh",
               "AZURE_CLIENT_SECRET": "PLANTED-az", "AZURE_STORAGE_CONNECTION_STRING": "AccountKey=PLANTED-ak",
               "AZURE_STORAGE_KEY": "PLANTED-sk", "GOOGLE_APPLICATION_CREDENTIALS": "/PLANTED/sa.json",
               "GOOGLE_API_KEY": "PLANTED-gk", "DB_PASSWORD": "PLANTED-pw"}
    for k, v in planted.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("FLEETOPS_PLAIN", "kept")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "kept")  # a word of the name decides: no TOKEN here
    cmd = [PY, "-c", "import os; print(sorted(v for v in os.environ.values() if 'PLANTED' in v or v in ('kept', 'mine')))"]
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("envy", cmd, env={"HF_TOKEN": "mine"})]})
    rec = run_until([agents("i-0")], terminal(bus, "envy"))
    assert rec["phase"] == "Succeeded" and rec["log_tail"] == ["['kept', 'kept', 'mine']"], rec["log_tail"]


def test_an_unassigned_replica_gets_its_checkpoint_signal_and_grace(bus, agents, tmp_path):
    ck = tmp_path / "ck"
    cmd = [PY, "-c", "import signal, sys, time, os\n"
           "def on(s, f):\n    open(os.environ['FLEETOPS_CHECKPOINT_DIR'] + '/saved', 'w').write('step 7'); sys.exit(0)\n"
           "signal.signal(signal.SIGUSR1, on)\nprint('ready', flush=True)\nwhile True: time.sleep(0.05)"]
    e = entry("ck", cmd, checkpoint={"dir": str(ck), "signal": "SIGUSR1", "grace_seconds": 30})
    bus.put_assignment("i-0", {"serial": 1, "replicas": [e]})
    a = agents("i-0")
    run_until([a], lambda: (r := bus.run("ck", 0)) and r["phase"] == "Running" and "ready" in r["log_tail"])
    bus.put_assignment("i-0", {"serial": 2, "replicas": []})
    rec = run_until([a], lambda: (r := bus.run("ck", 0)) and r["phase"] == "Stopped" and r)
    assert rec["reason"] == "Unassigned" and rec["exit_code"] == 0  # it exited on the signal, within its grace
    assert (ck / "saved").read_text() == "step 7"


def test_docker_runtime_command_line():
    launch = Launch(name="fleetops-train-1-0", command=("python", "train.py", "--epochs", "3"),
                    env={"RANK": "1", "WORLD_SIZE": "2", "NVIDIA_VISIBLE_DEVICES": "0,1"}, log_path=Path("/var/lib/fleetops/logs/train-1.log"),
                    image="ghcr.io/acme/train:1.4", gpus=("0", "1"), checkpoint_dir="/ckpt",
                    checkpoint_host_dir=Path("/var/lib/fleetops/checkpoints/train/ckpt"))
    assert docker_command(launch) == [
        "docker", "run", "--rm", "--name", "fleetops-train-1-0", "--network", "host", "--ipc", "host",
        "--gpus", '"device=0,1"', "--volume", "/var/lib/fleetops/checkpoints/train/ckpt:/ckpt",
        "--env", "NVIDIA_VISIBLE_DEVICES=0,1", "--env", "RANK=1", "--env", "WORLD_SIZE=2",
        "ghcr.io/acme/train:1.4", "python", "train.py", "--epochs", "3",
    ]
    # What a shell would pass: `--gpus '"device=0,1"'` arrives as this one argument.
    assert shlex.split("""docker run --gpus '"device=0,1"'""")[3] == '"device=0,1"'


def test_docker_runtime_without_docker_or_image_is_a_start_error(bus, agents, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker here
    a = Agent("i-0", bus, DockerRuntime(), tmp_path / "i-0", address="127.0.0.1", poll=0.05, heartbeat=0.2, log=lambda m: None)
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("c", ["python", "x.py"], run={"image": "img", "command": ["python"], "env": {}})]})
    rec = run_until([a], terminal(bus, "c"))
    assert rec["reason"] == "StartError" and "docker is not installed" in rec["message"]


def test_a_command_missing_from_the_image_is_a_start_error_not_restarted(bus, tmp_path):
    """README: `StartError` for a command that does not exist. On cloud instances (the docker runtime) docker itself
    starts the command, and one missing from the image was an ordinary exit 127: restarted backoff_limit times (10 s,
    20 s, 40 s ...), then BackoffLimitExceeded. Docker's own refusal (its "Error response from daemon", exit 126 or 127)
    is now the StartError it is; an exit 127 of the command itself is still a failure that restarts."""
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\n"
                    "echo 'docker: Error response from daemon: failed to create task for container: failed to create shim task: OCI "
                    "runtime create failed: runc create failed: unable to start container process: exec: \"pyhton3\": executable "
                    "file not found in $PATH: unknown.' >&2\necho >&2\necho \"Run 'docker run --help' for more information\" >&2\nexit 127\n")
    fake.chmod(0o755)
    a = Agent("i-0", bus, DockerRuntime(docker=str(fake)), tmp_path / "i-0", address="127.0.0.1", poll=0.05, heartbeat=0.2,
              backoff=0.05, log=lambda m: None)
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("typo", ["pyhton3"], run={"image": "img", "command": ["pyhton3"], "env": {}})]})
    rec = run_until([a], terminal(bus, "typo"))
    assert (rec["phase"], rec["reason"], rec["restarts"]) == ("Failed", "StartError", 0), rec  # before: BackoffLimitExceeded, 2
    assert 'exec: "pyhton3": executable file not found' in rec["message"]
    fake.write_text("#!/bin/sh\necho 'train.sh: 3: preprocess: not found'\nexit 127\n")  # the command's own 127
    bus.put_assignment("i-0", {"serial": 2, "replicas": [entry("own", ["train.sh"], run={"image": "img", "command": ["train.sh"], "env": {}})]})
    rec = run_until([a], terminal(bus, "own"))
    assert (rec["reason"], rec["restarts"]) == ("BackoffLimitExceeded", 2), rec


def test_a_command_named_relative_to_the_config_dir_runs_there_whatever_the_agents_own_directory(bus, tmp_path):
    """The sim's agents run commands in the config directory (`--cwd`), as `python3 bin/train.py` does, but a command
    itself named by a relative path (`./prepare.sh` beside the config) was looked for in the agent's own working
    directory, apply's: a StartError "not found" unless apply ran from the config directory. It is looked for where it
    runs."""
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "prepare.sh").write_text("#!/bin/sh\necho prepared\n")
    (cfg / "prepare.sh").chmod(0o755)
    assert not (Path.cwd() / "prepare.sh").exists()
    a = Agent("i-0", bus, ProcessRuntime(), tmp_path / "i-0", address="127.0.0.1", poll=0.05, heartbeat=0.2, command_cwd=cfg,
              log=lambda m: None)
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("prep", ["./prepare.sh"])]})
    rec = run_until([a], terminal(bus, "prep"))
    assert (rec["phase"], rec["log_tail"]) == ("Succeeded", ["prepared"]), rec  # before: Failed, StartError


def test_a_replica_unassigned_in_its_restart_backoff_is_reported_stopped(bus, tmp_path):
    """A replica waiting out a restart's backoff that the plan took away (the job removed, evicted or moved) was dropped
    without a last report: its run record said Starting (BackOff) for good, and `reconcile logs --follow` of it never
    ended. It is reported Stopped (Unassigned), as a running one is."""
    a = Agent("i-0", bus, ProcessRuntime(), tmp_path / "i-0", address="127.0.0.1", poll=0.05, heartbeat=0.2, backoff=30,
              log=lambda m: None)
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("crashy", [PY, "-c", "raise SystemExit(1)"])]})
    run_until([a], lambda: (r := bus.run("crashy", 0)) is not None and r["reason"] == "BackOff")
    bus.put_assignment("i-0", {"serial": 2, "replicas": []})
    run_until([a], lambda: not a.replicas)
    rec = bus.run("crashy", 0)
    assert (rec["phase"], rec["reason"], rec["terminal"]) == ("Stopped", "Unassigned", False), rec  # before: Starting, BackOff


def test_agent_heartbeat_names_its_state_and_address(bus, agents):
    a = agents("i-0")
    a.tick()
    doc = bus.agent("i-0")
    assert doc["state"] == "Ready" and doc["address"] == "127.0.0.1" and doc["pid"] == os.getpid()
    assert abs(doc["heartbeat_at"] - time.time()) < 60


@pytest.fixture
def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_replica_that_ignores_its_checkpoint_signal_is_killed_after_the_grace_period(bus, agents, tmp_path):
    cmd = [PY, "-c", "import signal, time\nsignal.signal(signal.SIGUSR1, signal.SIG_IGN)\nprint('ready', flush=True)\nwhile True: time.sleep(0.05)"]
    e = entry("stubborn", cmd, checkpoint={"dir": str(tmp_path / "ck"), "signal": "SIGUSR1", "grace_seconds": 0.5})
    bus.put_assignment("i-0", {"serial": 1, "replicas": [e]})
    a = agents("i-0")
    run_until([a], lambda: (r := bus.run("stubborn", 0)) and r["phase"] == "Running" and "ready" in r["log_tail"])
    bus.put_assignment("i-0", {"serial": 2, "replicas": []})
    rec = run_until([a], lambda: (r := bus.run("stubborn", 0)) and r["phase"] == "Stopped" and r)
    assert rec["reason"] == "Unassigned" and rec["exit_code"] == -9  # SIGKILL once the grace was over
    assert not any(r.running for r in a.replicas.values())


def test_a_gang_member_that_fails_for_good_stops_the_others(bus, agents, free_port):
    never = {"policy": "Never", "backoff_limit": 0}
    serve = [PY, "-c", "import time\nprint('up', flush=True)\nwhile True: time.sleep(0.05)"]
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("g", serve, replica=0, world=2, master_port=free_port, restart=never)]})
    bus.put_assignment("i-1", {"serial": 1, "replicas": [entry("g", [PY, "-c", "raise SystemExit(4)"], replica=1, world=2,
                                                               master_port=free_port, restart=never)]})
    a0, a1 = agents("i-0"), agents("i-1")
    run_until([a0, a1], lambda: all((r := bus.run("g", i)) and r["terminal"] for i in (0, 1)))
    r0, r1 = bus.run("g", 0), bus.run("g", 1)
    assert (r1["phase"], r1["reason"], r1["exit_code"]) == ("Failed", "Error", 4)
    assert (r0["phase"], r0["reason"]) == ("Failed", "GangFailed") and "replica 1 failed: Error" in r0["message"]
    assert not any(r.running for a in (a0, a1) for r in a.replicas.values())  # all or nothing, as it was placed


def test_logs_shows_the_replica_asked_for(bus, agents, tmp_path, free_port):
    from typer.testing import CliRunner

    from reconciler.cli import app

    cmd = [PY, "-c", "import os; print('hello from rank', os.environ['RANK'])"]
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("pair", cmd, replica=r, world=2, master_port=free_port) for r in (0, 1)]})
    run_until([agents("i-0")], lambda: all((r := bus.run("pair", i)) and r["terminal"] for i in (0, 1)))
    out = CliRunner().invoke(app, ["logs", str(tmp_path), "pair", "--replica", "1"])
    assert out.exit_code == 0 and "hello from rank 1" in out.output and "hello from rank 0" not in out.output
    missing = CliRunner().invoke(app, ["logs", str(tmp_path), "pair", "--replica", "5"])
    assert missing.exit_code == 1 and "no run of pair/5 has been reported yet" in missing.output



def test_logs_follow_goes_on_across_a_move_to_the_replicas_end(bus, tmp_path):
    """Before, `logs --follow` ended at the first Stopped record: a spot interruption or a move (the old copy stopped,
    its record `Stopped`) ended it while the replica went on elsewhere. Now a stop the replica is still assigned after
    is followed to the new copy's log, to the replica's end."""
    import subprocess

    release = tmp_path / "release"
    cmd = [PY, "-c", "import os, pathlib, signal, sys, time\n"
           "here = os.environ['FLEETOPS_INSTANCE']\n"
           "signal.signal(signal.SIGTERM, lambda *a: (print('checkpointed on', here, flush=True), sys.exit(0)))\n"
           "print('running on', here, flush=True)\n"
           f"while not pathlib.Path({str(release)!r}).exists(): time.sleep(0.05)\n"
           "print('done on', here, flush=True)"]
    ck = {"dir": "/ckpt", "signal": "SIGTERM", "grace_seconds": 30}
    sim = tmp_path / ".reconcile" / "sim" / "agents"  # where `logs` finds the sim's agents' files
    a0, a1 = (Agent(i, bus, ProcessRuntime(), sim / i, address="127.0.0.1", poll=0.05, heartbeat=0.2, log=lambda m: None,
                    checkpoint_sync=False) for i in ("i-0", "i-1"))
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("ft", cmd, checkpoint=ck)]})
    run_until([a0], lambda: (r := bus.run("ft", 0)) and "running on i-0" in r["log_tail"])
    follow = subprocess.Popen([PY, "-m", "reconciler.cli", "logs", str(tmp_path), "ft", "--follow"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "FLEETOPS_AGENT_POLL_SECONDS": "0.1"})
    import queue
    import threading

    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(ln) for ln in follow.stdout], daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        # (it prints the first copy's lines before the move: waited for, not slept on; a 1 s sleep was too short for
        # the CLI's start under a loaded CI, and it followed the moved copy only)
        while "running on i-0\n" not in seen:
            seen.append(lines.get(timeout=60))
        bus.put_assignment("i-0", {"serial": 2, "replicas": []})  # moved (an interruption's apply)
        bus.put_assignment("i-1", {"serial": 2, "replicas": [entry("ft", cmd, checkpoint=ck, epoch=2, master="i-1")]})
        run_until([a0], lambda: (r := bus.run("ft", 0)) and r["phase"] == "Stopped")
        time.sleep(1.0)  # (--follow sees the Stopped record: it ended here before)
        run_until([a0, a1], lambda: (r := bus.run("ft", 0)) and "running on i-1" in r["log_tail"])
        release.touch()
        run_until([a0, a1], terminal(bus, "ft"))
        follow.wait(timeout=60)
        reader.join(timeout=10)
        err = follow.stderr.read()
    finally:
        follow.kill()
        for a in (a0, a1):
            for rep in a.replicas.values():
                if rep.handle is not None:
                    a.runtime.kill(rep.handle)
    out = "".join(seen + [lines.get() for _ in range(lines.qsize())])
    assert [ln for ln in out.splitlines() if not ln.startswith("--- fleetops:")] == ["running on i-0", "checkpointed on i-0", "running on i-1", "done on i-1"], (out, err)
    assert "Stopped on i-0 (Unassigned" in err and "--- ft/0 on i-1 (now)" in err and "Succeeded (Completed" in err, err



def test_logs_follow_ends_at_a_stop_no_assignment_names_any_more(bus, tmp_path):
    """The other side of following a move: a replica stopped because its job was removed (no assignment names it)
    ends `logs --follow` with its stop, as before."""
    import subprocess

    cmd = [PY, "-c", "import time\nprint('up', flush=True)\nwhile True: time.sleep(0.05)"]
    a = Agent("i-0", bus, ProcessRuntime(), tmp_path / ".reconcile" / "sim" / "agents" / "i-0", address="127.0.0.1", poll=0.05,
              heartbeat=0.2, log=lambda m: None)
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("gone", cmd)]})
    run_until([a], lambda: (r := bus.run("gone", 0)) and "up" in r["log_tail"])
    follow = subprocess.Popen([PY, "-m", "reconciler.cli", "logs", str(tmp_path), "gone", "--follow"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "FLEETOPS_AGENT_POLL_SECONDS": "0.1"})
    try:
        bus.put_assignment("i-0", {"serial": 2, "replicas": []})  # the job removed
        run_until([a], lambda: (r := bus.run("gone", 0)) and r["phase"] == "Stopped")
        out, err = follow.communicate(timeout=60)
    finally:
        follow.kill()
        for rep in a.replicas.values():
            if rep.handle is not None:
                a.runtime.kill(rep.handle)
    assert "up" in out.splitlines() and "--- gone/0: Stopped (Unassigned: no longer assigned here)" in err, (out, err)


# A replica that notes when it starts, when its checkpoint signal (SIGTERM) arrives and when it exits, with
# its GPUs, and checkpoints for CHECKPOINT_SECONDS before it exits.
NOTED = r'''
import os, signal, sys, time
def note(what):
    with open(os.environ["NOTES"], "a") as f:
        f.write(f"{os.environ['TAG']} {what} {time.time():.6f} {os.environ.get('CUDA_VISIBLE_DEVICES', '-')}\n")
def on_term(s, f):
    note("checkpointing")
    time.sleep(float(os.environ["CHECKPOINT_SECONDS"]))
    note("exit")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
note("start")
while True:
    time.sleep(0.05)
'''


def noted(job: str, notes: Path, tag: str | None = None, gpus=(), checkpoint_seconds: float = 1.5, grace: float = 30, **kw) -> dict:
    env = {"NOTES": str(notes), "TAG": tag or job, "CHECKPOINT_SECONDS": str(checkpoint_seconds)}
    return entry(job, [PY, "-c", NOTED], gpus=list(gpus), env=env, checkpoint={"dir": str(notes.parent / "ck"), "signal": "SIGTERM",
                                                                               "grace_seconds": grace}, **kw)


def notes_of(path: Path) -> dict[tuple[str, str], float]:
    """(tag, what) -> when, from the replicas' own notes."""
    lines = path.read_text().splitlines() if path.exists() else []
    return {(t, what): float(when) for t, what, when, _ in (ln.split() for ln in lines)}


def noted_at(path: Path, *keys: tuple[str, str]):
    return lambda: (n := notes_of(path)) and all(k in n for k in keys) and n


@pytest.mark.parametrize(("held", "other"), [("2", "3"), ("0:1", "0:2")], ids=["gpu", "mig"])
def test_a_replica_given_a_stopping_replicas_gpu_starts_only_once_it_has_exited(bus, agents, tmp_path, held, other):
    """The audit's case: j3 leaves and n2 is given its GPU in one edit. n2 waits, reported as
    WaitingForGPUs, until j3 has checkpointed and exited; a replica on another device and a CPU-only
    one start at once."""
    notes = tmp_path / "notes"
    mig = {"mig_profile": "2g.20gb", "mig_layout": ["3g.40gb", "2g.20gb", "2g.20gb"]} if ":" in held else {}
    bus.put_assignment("i-0", {"serial": 1, "replicas": [noted("j3", notes, gpus=[held], checkpoint_seconds=2, **mig)]})
    a = agents("i-0")
    run_until([a], noted_at(notes, ("j3", "start")))
    bus.put_assignment("i-0", {"serial": 2, "replicas": [noted("n2", notes, gpus=[held], **mig), noted("side", notes, gpus=[other], **mig),
                                                         noted("cpu", notes)]})
    seen = []  # n2's record at every tick
    n = run_until([a], lambda: seen.append(bus.run("n2", 0)) or noted_at(notes, ("j3", "exit"), ("n2", "start"), ("side", "start"), ("cpu", "start"))())
    assert n["n2", "start"] >= n["j3", "exit"], n  # never two processes on one GPU
    assert n["side", "start"] < n["j3", "exit"] and n["cpu", "start"] < n["j3", "exit"], n  # nothing else waited
    waiting = next(r for r in seen if r and r["reason"] == "WaitingForGPUs")  # what `reconcile status` showed meanwhile
    assert waiting["phase"] == "Starting" and f"{held} held by j3/0, stopping (Unassigned)" in waiting["message"], waiting
    assert run_until([a], lambda: (r := bus.run("n2", 0)) and r["phase"] == "Running" and r)["reason"] == "Started"


def test_a_replica_restarting_in_place_with_a_new_spec_waits_for_its_old_process(bus, agents, tmp_path):
    notes = tmp_path / "notes"
    bus.put_assignment("i-0", {"serial": 1, "replicas": [noted("train", notes, tag="old", gpus=["0", "1"])]})
    a = agents("i-0")
    run_until([a], noted_at(notes, ("old", "start")))
    bus.put_assignment("i-0", {"serial": 2, "replicas": [noted("train", notes, tag="new", gpus=["0", "1"], spec_hash="h2")]})
    n = run_until([a], noted_at(notes, ("old", "exit"), ("new", "start")))
    assert n["new", "start"] >= n["old", "exit"], n


def test_the_wait_for_a_stuck_stopping_replica_ends_with_its_grace(bus, agents, tmp_path):
    """A replica that does not exit on its checkpoint signal is killed after its grace, as before; the
    replica given its GPU then starts (the wait is bounded by that grace)."""
    notes = tmp_path / "notes"
    bus.put_assignment("i-0", {"serial": 1, "replicas": [noted("stuck", notes, gpus=["2"], checkpoint_seconds=600, grace=1)]})
    a = agents("i-0")
    run_until([a], noted_at(notes, ("stuck", "start")))
    bus.put_assignment("i-0", {"serial": 2, "replicas": [noted("next", notes, gpus=["2"])]})
    n = run_until([a], noted_at(notes, ("stuck", "checkpointing"), ("next", "start")))
    assert n["next", "start"] >= n["stuck", "checkpointing"] + 0.8, n  # not before the grace was over
    assert bus.run("stuck", 0)["exit_code"] == -9 and ("stuck", "exit") not in n


def test_an_agent_stopped_while_a_replica_waits_for_gpus_does_not_start_it(bus, agents, tmp_path):
    import threading

    notes = tmp_path / "notes"
    bus.put_assignment("i-0", {"serial": 1, "replicas": [noted("old", notes, gpus=["2"])]})
    a = agents("i-0")
    run_until([a], noted_at(notes, ("old", "start")))
    bus.put_assignment("i-0", {"serial": 2, "replicas": [noted("new", notes, gpus=["2"])]})
    run_until([a], lambda: bus.run("new", 0))
    done = threading.Thread(target=a.shutdown, daemon=True)
    done.start()
    done.join(timeout=60)
    assert not done.is_alive()  # every replica stopped, the agent with them
    n = notes_of(notes)
    assert ("old", "exit") in n and ("new", "start") not in n, n
    assert bus.run("new", 0)["started_at"] is None


def test_a_replica_moved_to_another_instance_starts_only_once_its_old_copy_has_exited(bus, agents, tmp_path):
    """The audit's case: a plan keeps i-0 and moves replica 1 to i-1. The new copy started at once, while the
    old one was still checkpointing on its SIGTERM (one rank ran twice, and the old checkpoint overwrote the
    new run's). i-1 now waits, reported as WaitingForPredecessor naming i-0, until i-0's agent reports it stopped."""
    notes = tmp_path / "notes"
    bus.put_assignment("i-0", {"serial": 1, "replicas": [noted("g3", notes, tag="old", replica=1, checkpoint_seconds=2)]})
    old, new = agents("i-0"), agents("i-1")
    run_until([old, new], noted_at(notes, ("old", "start")))
    bus.put_assignment("i-0", {"serial": 2, "replicas": []})
    bus.put_assignment("i-1", {"serial": 2, "replicas": [noted("g3", notes, tag="new", replica=1, epoch=2)]})
    seen = []
    n = run_until([old, new], lambda: seen.append(bus.run("g3", 1)) or noted_at(notes, ("old", "exit"), ("new", "start"))())
    assert n["new", "start"] >= n["old", "exit"], n  # never the same rank twice
    waiting = next(r for r in seen if r and r["reason"] == "WaitingForPredecessor")
    assert waiting["instance"] == "i-1" and waiting["phase"] == "Starting" and "previous copy on i-0" in waiting["message"], waiting


@pytest.mark.parametrize("fault", ["corrupt", "unreachable"])
def test_a_moved_replica_waits_for_its_old_copy_while_the_old_agents_report_cannot_be_read(bus, agents, tmp_path, fault):
    """The old copy checkpoints through its grace; its agent's report is garbled (a torn write on a store without atomic
    puts, a hand edit) or the bus fails the read. That was taken as "no evidence that it still runs" and the new copy
    started at once beside it: one rank twice, two writers of one checkpoint. A report that cannot be read holds the
    rank as the last one did; the wait still ends after the grace plus its margin, as for a report that never changes."""
    notes = tmp_path / "notes"
    bus.put_assignment("i-0", {"serial": 1, "replicas": [noted("g3", notes, tag="old", replica=1, checkpoint_seconds=30)]})
    old, new = agents("i-0"), agents("i-1")
    run_until([old], noted_at(notes, ("old", "start")))
    bus.put_assignment("i-0", {"serial": 2, "replicas": []})
    run_until([old], noted_at(notes, ("old", "checkpointing")))  # the old copy in its 30 s grace; its agent reports it
    assert "g3/1" in bus.agent("i-0")["running"]
    bus.put_assignment("i-1", {"serial": 2, "replicas": [noted("g3", notes, tag="new", replica=1, epoch=2, master="i-1")]})
    if fault == "corrupt":
        bus.store.write_key("agents/i-0.json", b'{"instance": "i-0", "runn')
    else:
        real = bus.store.read_key

        def read_key(key):  # (the store fails this one read: a network error, throttling)
            if key == "agents/i-0.json":
                raise ReconcileError("s3: cannot read agents/i-0.json: connection reset by peer")
            return real(key)

        bus.store.read_key = read_key
    began = time.monotonic()
    while time.monotonic() - began < 1.5:
        new.tick()
        time.sleep(0.05)
    assert ("new", "start") not in notes_of(notes)
    rec = bus.run("g3", 1)
    assert rec["instance"] == "i-1" and rec["reason"] == "WaitingForPredecessor" and "i-0" in rec["message"], rec


@pytest.mark.parametrize("fault", ["report garbled", "runs unreadable"])
def test_a_gang_rank_waits_for_a_peers_upload_while_that_peers_agents_report_cannot_be_read(bus, ck_agents, tmp_path, fault):
    """Rank 0 of the gang's last round still runs (or uploads) on i-9 by its agent's last word; that report is now garbled.
    Rank 1, placed anew on i-1, took the unreadable report as nothing running and restored at once: the round without
    rank 0's upload, an older one than rank 0 would resume from. It waits as for a report that lists rank 0."""
    bus.put_run("g", 0, {"job": "g", "replica": 0, "instance": "i-9", "spec_hash": "h1", "epoch": 1, "phase": "Running",
                         "reason": "Started", "terminal": False, "attempt": 0})
    bus.store.write_key("agents/i-9.json", b'{"instance": "i-9", "running": ["g/')
    notes = tmp_path / "notes"
    bus.put_assignment("i-1", {"serial": 2, "replicas": [noted("g", notes, tag="new", replica=1, epoch=2, world_size=2, master="i-1")]})
    a = ck_agents("i-1")
    if fault == "runs unreadable":  # the run records' listing fails instead: whether rank 0 still runs is unknown too
        store = FailingCheckpointReads(tmp_path)
        store.prefix = "runs/g"
        a.bus = Bus(store)
    began = time.monotonic()
    while time.monotonic() - began < 1.0:
        a.tick()
        time.sleep(0.05)
    assert ("new", "start") not in notes_of(notes)
    rec = bus.run("g", 1)
    assert rec["reason"] == "WaitingForGang" and "cannot be read" in rec["message"], rec


def test_a_moved_replica_waits_for_an_old_agent_whose_clock_runs_behind(bus, agents, tmp_path):
    """The old copy's agent beats every poll, but its host's clock is 120 s behind this one's: its heartbeat times,
    compared with this host's clock, looked older than the stale limit (60 s), so the moved copy took the agent as
    lost and started beside the old copy, one rank twice. A report is judged by when this agent last saw its
    heartbeat change, on its own monotonic clock: the wait holds until that agent drops the replica."""
    from reconciler.runtime.bus import now_unix

    notes = tmp_path / "notes"
    bus.put_run("g3", 1, {"job": "g3", "replica": 1, "instance": "i-0", "spec_hash": "h1", "epoch": 1, "phase": "Running",
                          "reason": "Started", "terminal": False, "attempt": 0})

    def beat(running):  # (i-0's agent, its clock 120 s behind)
        bus.put_agent("i-0", {"instance": "i-0", "heartbeat_at": now_unix() - 120, "state": "Ready", "running": running})

    beat(["g3/1"])
    bus.put_assignment("i-1", {"serial": 2, "replicas": [noted("g3", notes, tag="new", replica=1, epoch=2, master="i-1")]})
    new = agents("i-1")
    began = time.monotonic()
    while time.monotonic() - began < 1.0:
        beat(["g3/1"])
        new.tick()
        time.sleep(0.05)
    assert ("new", "start") not in notes_of(notes)
    rec = bus.run("g3", 1)
    assert rec["instance"] == "i-1" and rec["reason"] == "WaitingForPredecessor" and "i-0" in rec["message"], rec
    beat([])  # the old copy stopped
    run_until([new], noted_at(notes, ("new", "start")), timeout=10)


def test_a_moved_replica_keeps_waiting_when_its_old_agents_live_report_is_deleted(bus, agents, tmp_path, monkeypatch):
    """The old copy checkpoints through its grace; its agent's report, which lists it, is deleted (an apply that judged
    it stale by a skewed clock); the agent writes it again at its next heartbeat. Meanwhile the moved copy read the
    missing key as "holds nothing" and started beside the old copy. A report seen alive and listing the replica, then
    deleted, holds it as it last said until it is stale by this agent's own clock (here 2 s)."""
    monkeypatch.setenv("FLEETOPS_HEARTBEAT_STALE_SECONDS", "2")
    notes = tmp_path / "notes"
    bus.put_assignment("i-0", {"serial": 1, "replicas": [noted("g3", notes, tag="old", replica=1, checkpoint_seconds=30)]})
    old, new = agents("i-0"), agents("i-1")
    run_until([old], noted_at(notes, ("old", "start")))
    bus.put_assignment("i-0", {"serial": 2, "replicas": []})
    run_until([old], noted_at(notes, ("old", "checkpointing")))
    bus.put_assignment("i-1", {"serial": 2, "replicas": [noted("g3", notes, tag="new", replica=1, epoch=2, master="i-1")]})
    run_until([old, new], lambda: (r := bus.run("g3", 1)) and r["reason"] == "WaitingForPredecessor")
    bus.store.delete_key("agents/i-0.json")  # (i-0's agent between two heartbeats from here on)
    deleted = time.monotonic()
    while time.monotonic() - deleted < 1.0:
        new.tick()
        time.sleep(0.05)
    assert ("new", "start") not in notes_of(notes)
    rec = bus.run("g3", 1)
    assert rec["reason"] == "WaitingForPredecessor" and "i-0" in rec["message"], rec
    run_until([new], noted_at(notes, ("new", "start")), timeout=10)  # stale by this agent's clock: it holds nothing
    assert time.monotonic() - deleted >= 1.0


def test_a_moved_replica_does_not_wait_for_an_agent_that_went_silent(bus, agents, tmp_path, monkeypatch):
    """The old agent stopped reporting (its instance lost): its stale heartbeat holds nothing, so the
    moved replica starts once that heartbeat is stale, not never."""
    monkeypatch.setenv("FLEETOPS_HEARTBEAT_STALE_SECONDS", "1")
    notes = tmp_path / "notes"
    bus.put_assignment("i-0", {"serial": 1, "replicas": [noted("g3", notes, tag="old", replica=1)]})
    old, new = agents("i-0"), agents("i-1")
    run_until([old], noted_at(notes, ("old", "start")))  # from now on i-0's agent is silent; its replica still runs
    bus.put_assignment("i-1", {"serial": 2, "replicas": [noted("g3", notes, tag="new", replica=1, epoch=2)]})
    silent = time.monotonic()
    run_until([new], noted_at(notes, ("new", "start")))
    assert time.monotonic() - silent >= 0.5  # it did wait for the heartbeat to go stale


def test_a_moved_replica_does_not_wait_for_an_agent_whose_instance_is_gone(bus, agents, tmp_path):
    """QA's rt3: the instance was reclaimed mid-checkpoint, its agent killed with it, its last report fresh and listing
    the replica running. Marked lost (the sim's reclaim, or apply once observe finds it gone), it holds nothing:
    the moved copy starts at its first tick, not after the report went stale (60 s)."""
    from reconciler.runtime.publish import mark_lost

    notes = tmp_path / "notes"
    bus.put_assignment("i-0", {"serial": 1, "replicas": [noted("g3", notes, tag="old", replica=1)]})
    old, new = agents("i-0"), agents("i-1")
    run_until([old], noted_at(notes, ("old", "start")))
    run_until([old], lambda: "g3/1" in (bus.agent("i-0") or {}).get("running", []))  # its last report: running
    mark_lost(bus.store, "i-0", "spot-interruption: the sim reclaimed it")
    bus.put_assignment("i-1", {"serial": 2, "replicas": [noted("g3", notes, tag="new", replica=1, epoch=2)]})
    new.tick()
    rec = bus.run("g3", 1)
    assert rec["instance"] == "i-1" and rec["reason"] != "WaitingForPredecessor", rec
    run_until([new], noted_at(notes, ("new", "start")), timeout=10)


def test_a_jobs_own_credential_it_prints_is_masked_in_its_log_tail_and_record(bus, agents, tmp_path):
    """Secrets audit: a job that printed a credential of its own run.env (HF_TOKEN, WANDB_API_KEY) put it in the log
    tail and the failure message, hence in `reconcile status` and the status/ files a workflow commits. The agent knows
    those values: masked where they leave the instance (the log file on the instance keeps what the job wrote). And the
    agent's record of a replica, which holds its environment, is readable by its owner only."""
    import stat

    secret = "hf_PLANTED_own_token_1234"
    cmd = [PY, "-c", "import os, sys; print('token is', os.environ['HF_TOKEN']); sys.exit(3)"]
    e = entry("leaky", cmd, env={"HF_TOKEN": secret, "MODE": "x"})
    e["restart"] = {"policy": "Never"}
    bus.put_assignment("i-0", {"serial": 1, "replicas": [e]})
    a = agents("i-0")
    rec = run_until([a], terminal(bus, "leaky"))
    assert rec["phase"] == "Failed", rec
    assert secret not in json.dumps(rec) and "token is ***" in rec["log_tail"], rec
    assert secret not in rec["message"], rec["message"]
    for f in (a.workdir / "replicas").glob("*.json"):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f


def test_a_credential_in_run_env_never_stands_in_the_docker_clients_command_line(bus, tmp_path):
    """Secrets audit: `docker run --env HF_TOKEN=value` stays in the process table for the container's life (the
    client runs in the foreground): any local user read it with ps. A credential (by its name) goes as `--env HF_TOKEN`,
    its value in the client's environment, which docker documents as where a bare --env NAME takes it from; a DOCKER_*
    name stays NAME=value (the client would read it as its own setting). Here a stand-in `docker` records what it got."""
    seen = tmp_path / "seen.json"
    fake = tmp_path / "docker"
    fake.write_text(f"#!{sys.executable}\nimport json, os, sys\njson.dump({{'argv': sys.argv[1:], 'env': dict(os.environ)}}, "
                    f"open({str(seen)!r}, 'w'))\n")
    fake.chmod(0o755)
    launch = Launch(name="fleetops-t-0", command=("python", "t.py"), env={"HF_TOKEN": "hf_PLANTED_123456", "MODE": "x",
                    "DOCKER_API_TOKEN_UNUSED": "d"}, log_path=tmp_path / "t.log", image="img")
    assert "hf_PLANTED_123456" not in " ".join(docker_command(launch))
    h = DockerRuntime(docker=str(fake)).start(launch)
    h.proc.wait(timeout=60)
    got = json.loads(seen.read_text())
    assert "hf_PLANTED_123456" not in " ".join(got["argv"]) and got["env"]["HF_TOKEN"] == "hf_PLANTED_123456", got["argv"]
    assert ["--env", "HF_TOKEN"] == got["argv"][got["argv"].index("HF_TOKEN") - 1:got["argv"].index("HF_TOKEN") + 1]
    assert "MODE=x" in got["argv"] and "DOCKER_API_TOKEN_UNUSED=d" in got["argv"]


# A rank that, on SIGTERM, writes its checkpoint (rank-R: the step it resumed from + 1) after CK_SECONDS and exits;
# started, it prints what it found.
RANKED = r'''
import os, signal, sys, time
d, r = os.environ["FLEETOPS_CHECKPOINT_DIR"], os.environ["RANK"]
path = os.path.join(d, f"rank-{r}")
found = open(path).read() if os.path.exists(path) else None
print("found", found, flush=True)
def on(s, f):
    time.sleep(float(os.environ["CK_SECONDS"]))
    os.makedirs(d, exist_ok=True)
    open(path, "w").write(str(int(found or 0) + 1))
    sys.exit(0)
signal.signal(signal.SIGTERM, on)
if os.environ.get("READY_DIR"):  # (its handler set: a SIGTERM before this ends it, SIG_DFL, with no checkpoint)
    open(os.path.join(os.environ["READY_DIR"], f"ready-{r}"), "w").close()
while True:
    time.sleep(0.05)
'''


def test_a_gangs_checkpoint_is_uploaded_once_both_ranks_wrote_it_and_restored_on_another_instances_disk(bus, ck_agents, tmp_path):
    """Two ranks of one job on one instance write into one checkpoint dir; rank 1 takes longer. The agent uploads
    the dir once neither runs any more (both files), and the agent of another instance, with its own disk, restores
    both before the ranks start there."""

    def gang(master: str, epoch: int) -> list[dict]:
        return [entry("g", [PY, "-c", RANKED], replica=r, world=2, master=master, epoch=epoch, checkpoint=CK, mode="service",
                      env={"CK_SECONDS": str(0.2 + 1.0 * r)}) for r in (0, 1)]

    bus.put_assignment("i-1", {"serial": 1, "replicas": gang("i-1", 1)})
    a = ck_agents("i-1")
    run_until([a], lambda: all((r := bus.run("g", i)) and "found None" in r["log_tail"] for i in (0, 1)))
    bus.put_assignment("i-1", {"serial": 2, "replicas": []})
    run_until([a], lambda: all((r := bus.run("g", i)) and r["phase"] == "Stopped" for i in (0, 1)))
    [doc] = [json.loads(bus.store.read_key(k)) for k in bus.store.list_keys("checkpoints/g/manifests")]
    assert sorted(f["path"] for f in doc["files"]) == ["rank-0", "rank-1"] and (doc["instance"], doc["epoch"]) == ("i-1", 1)
    bus.put_assignment("i-2", {"serial": 3, "replicas": gang("i-2", 2)})
    b = ck_agents("i-2")
    run_until([b], lambda: all((r := bus.run("g", i)) and r["instance"] == "i-2" and "found 1" in r["log_tail"] for i in (0, 1)))
    assert (tmp_path / "i-2" / "disk" / "g" / "ckpt" / "rank-1").read_text() == "1"


def test_a_gang_stops_with_a_rank_that_stops_and_every_instance_uploads_its_round(bus, ck_agents, tmp_path):
    """Ranks 0 and 1 on two instances; rank 1 is unassigned (its instance deleted, as an apply does before it publishes
    the gang's next epoch). Rank 0 gets its checkpoint signal as soon as rank 1's stop begins (GangStopped), and waits
    (WaitingForGang) instead of running on alone; both instances upload a manifest of the round naming their rank.
    Then rank 1 past its time limit: rank 0, stopped GangFailed, uploads too, else that round lacked its rank. Before,
    rank 0 was never signalled, and a GangFailed rank uploaded nothing."""

    def rank(r: int, epoch: int, **kw) -> dict:
        return entry("g", [PY, "-c", RANKED], replica=r, world=2, master="i-0", epoch=epoch, checkpoint=CK, mode="service",
                     env={"CK_SECONDS": "0.2", "READY_DIR": str(tmp_path)}, **kw)

    def manifests(epoch: int) -> dict[str, list[int]]:
        docs = [json.loads(bus.store.read_key(k)) for k in bus.store.list_keys("checkpoints/g/manifests")]
        return {d["instance"]: d.get("replicas") for d in docs if d["epoch"] == epoch}

    bus.put_assignment("i-0", {"serial": 1, "replicas": [rank(0, 1)]})
    bus.put_assignment("i-1", {"serial": 1, "replicas": [rank(1, 1)]})
    a, b = ck_agents("i-0"), ck_agents("i-1")
    # (both ranks' handlers set before the stop, whose checkpoints this test follows: a SIGTERM before a rank's handler
    # ends it by its default action, with no checkpoint; before the shim's fix it was lost, test_runtime_shim)
    run_until([a, b], lambda: all((r := bus.run("g", i)) and r["phase"] == "Running" and (tmp_path / f"ready-{i}").exists() for i in (0, 1)))
    bus.put_assignment("i-1", {"serial": 2, "replicas": []})
    rec = run_until([a, b], lambda: (r := bus.run("g", 0)) and r["phase"] != "Running" and r)
    assert rec["phase"] == "Starting" and rec["reason"] in ("GangStopped", "WaitingForGang"), rec
    rec = run_until([a, b], lambda: (r := bus.run("g", 0)) and r["reason"] == "WaitingForGang" and r)
    assert "replica 1 stopped (Unassigned) on i-1" in rec["message"], rec
    assert not a.replicas["g", 0].running  # never ran on alone
    assert run_until([a, b], lambda: len(m := manifests(1)) == 2 and m) == {"i-0": [0], "i-1": [1]}

    bus.put_assignment("i-0", {"serial": 3, "replicas": [rank(0, 3)]})
    bus.put_assignment("i-1", {"serial": 3, "replicas": [rank(1, 3, time_limit_hours=3 / 3600)]})
    run_until([a, b], lambda: (r := bus.run("g", 0)) and r["terminal"] and (q := bus.run("g", 1)) and q["terminal"])
    assert (bus.run("g", 1)["reason"], bus.run("g", 0)["reason"]) == ("DeadlineExceeded", "GangFailed")
    assert run_until([a, b], lambda: len(m := manifests(3)) == 2 and m) == {"i-0": [0], "i-1": [1]}


def test_an_agent_that_cannot_write_its_run_records_says_so_once_and_status_shows_it_unreachable(bus, tmp_path):
    """An agent whose run-record writes fail (a policy without runs/*, a full disk) while its heartbeat goes through.
    Before, it logged no failure but "the bus is reachable again" at every poll, and status showed its running replica
    Starting (Assigned), and a finished one as its last record said. Now the failure is logged once, the heartbeat
    carries it, and status shows the replica Unknown (AgentUnreachable) with why, until a record is written again."""
    from reconciler.runtime.assign import spec_hash
    from reconciler.runtime.lifecycle import runtime_view
    from tests.test_runtime_lifecycle import desired

    d = desired(tmp_path / "cfg", replicas=1)
    lines: list[str] = []
    a = Agent("i-0", bus, ProcessRuntime(), tmp_path / "w", address="127.0.0.1", poll=0.05, heartbeat=0.2, log=lines.append)
    blocker = tmp_path / ".reconcile" / "runs" / "j"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("")  # a file where runs/j/ goes: every write of runs/j/0.json fails
    cmd = [PY, "-c", "import time\nwhile True: time.sleep(0.05)"]
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("j", cmd, spec_hash=spec_hash(d.jobs["j"]))]})
    try:
        run_until([a], lambda: (b := bus.agent("i-0")) and b["running"] == ["j/0"])
        for _ in range(10):
            a.tick()
        view = lambda: runtime_view(d, {"j": ["i-0"]}, bus.runs(), bus.agents(), ["i-0"], time.time(), 60).jobs["j"]  # noqa: E731
        v = view()
        assert (v.phase, v.reason) == ("Unknown", "AgentUnreachable"), v  # before: Starting (Assigned)
        assert "cannot write its run records: cannot write the run record of j/0" in v.message, v.message
        assert sum("cannot write the run record" in ln for ln in lines) == 1 and not any("reachable again" in ln for ln in lines), lines
        blocker.unlink()
        run_until([a], lambda: bus.run("j", 0) and not bus.agent("i-0").get("write_failed"))
        assert view().phase == "Running"
        assert sum("reachable again" in ln for ln in lines) == 1, lines
    finally:
        for rep in a.replicas.values():
            if rep.handle is not None:
                a.runtime.kill(rep.handle)


def test_a_gang_whose_peers_agent_is_lost_checkpoints_waits_and_resumes_the_newest_complete_round(bus, ck_agents, tmp_path, monkeypatch):
    """Rank 1's instance vanishes (its agent and rank killed, no notice, no Stopped report: its record says Running for
    ever). Before, rank 0 ran on alone (a DDP rank hung in its next collective). Now, once rank 1's agent is no longer
    alive by the bus's rule (heartbeat older than FLEETOPS_HEARTBEAT_STALE_SECONDS, 2 s here), rank 0 gets its checkpoint
    signal (GangPeerLost, naming the rank and instance), uploads, and waits; not before (a blip shorter than that limit
    stops nothing). Placed again (rank 1 on a new instance), both resume from the newest complete round, not rank 0's
    own newer file of the round rank 1 never uploaded."""
    monkeypatch.setenv("FLEETOPS_HEARTBEAT_STALE_SECONDS", "2")

    def place(epoch: int, where: dict[int, str]) -> None:
        for r, inst in where.items():
            bus.put_assignment(inst, {"serial": epoch, "replicas": [entry("g", [PY, "-c", RANKED], replica=r, world=2, master=where[0],
                                                                          epoch=epoch, checkpoint=CK, mode="service", env={"CK_SECONDS": "0.2"})]})

    def found(agents: list[Agent], what: str) -> None:
        run_until(agents, lambda: all((r := bus.run("g", i)) and r["phase"] == "Running" and f"found {what}" in r["log_tail"] for i in (0, 1)),
                  timeout=30)

    a, b = ck_agents("i-0"), ck_agents("i-1")
    place(1, {0: "i-0", 1: "i-1"})
    found([a, b], "None")
    place(2, {0: "i-0", 1: "i-1"})  # a new epoch in place: both stop, round 1 is complete (rank-0 and rank-1 hold 1)
    found([a, b], "1")

    for rep in b.replicas.values():  # the instance i-1 vanishes: its rank dies with it, its agent ticks no more
        b.runtime.kill(rep.handle)
    lost_at = time.monotonic()
    while time.monotonic() - lost_at < 1.0:  # within the stale limit: a blip, nothing stops
        a.tick()
        time.sleep(0.05)
    assert bus.run("g", 0)["phase"] == "Running" and a.replicas["g", 0].running
    seen = []
    rec = run_until([a], lambda: (r := bus.run("g", 0)) and seen.append(r["reason"]) is None and r["reason"] == "WaitingForGang" and r,
                    timeout=20)  # before: Running for ever
    assert "GangPeerLost" in seen, seen
    assert "replica 1's agent on i-1 is lost (no heartbeat since" in rec["message"] and "it starts again with the gang" in rec["message"], rec
    assert not a.replicas["g", 0].running and rec["attempt"] == 1, rec
    assert (tmp_path / "i-0" / "disk" / "g" / "ckpt" / "rank-0").read_text() == "2"  # it checkpointed at its signal
    docs = [json.loads(bus.store.read_key(k)) for k in bus.store.list_keys("checkpoints/g/manifests")]
    assert [(d["instance"], d["replicas"]) for d in docs if d["epoch"] == 2] == [("i-0", [0])], docs  # and uploaded
    for _ in range(10):
        a.tick()
    assert not a.replicas["g", 0].running  # it waits: never runs with a rank missing

    c = ck_agents("i-2")
    bus.delete_assignment("i-1")
    place(3, {0: "i-0", 1: "i-2"})  # the reconciler places rank 1 anew
    found([a, c], "1")  # round 1, the newest complete one, for both: not rank 0's own 2
    assert (tmp_path / "i-0" / "disk" / "g" / "ckpt" / "rank-0").read_text() == "1"


def test_a_gang_waits_for_a_peer_not_started_yet_and_restarts_whole_when_a_lost_agent_comes_back(bus, ck_agents, tmp_path, monkeypatch):
    """First start: rank 1's agent starts later than rank 0's (its record absent) and rank 0 runs on: a peer not
    started yet is not lost. Then, in the gang's next epoch (round 1 restored), rank 1's agent is killed (SIGKILL: its
    rank runs on, unwatched, its heartbeat goes stale) and rank 0 stops (GangPeerLost), uploads and waits. The agent
    comes back (systemd) and adopts its rank: the gang restarts whole, both ranks at the next attempt, each from what it
    wrote at its signal (a restart in place), not rank 0 alone beside the copy of rank 1 that ran on without it."""
    monkeypatch.setenv("FLEETOPS_HEARTBEAT_STALE_SECONDS", "1.5")

    def place(epoch: int) -> None:
        for r in (0, 1):
            bus.put_assignment(f"i-{r}", {"serial": epoch, "replicas": [entry("g", [PY, "-c", RANKED], replica=r, world=2, master="i-0",
                                                                               checkpoint=CK, epoch=epoch, mode="service", env={"CK_SECONDS": "0.2"})]})

    def said(i: int, attempt: int) -> str | None:  # what that attempt of rank i found (its log: the record's tail may be older)
        text = (tmp_path / f"i-{i}" / "logs" / f"g-{i}.log").read_text().rsplit(f"--- fleetops: attempt {attempt} ", 1)
        return next((ln for ln in text[1].splitlines() if ln.startswith("found")), None) if len(text) == 2 else None

    place(1)
    a = ck_agents("i-0")
    run_until([a], lambda: (r := bus.run("g", 0)) and r["phase"] == "Running")
    began = time.monotonic()
    while time.monotonic() - began < 2.0:  # longer than the stale limit, rank 1's agent not started
        a.tick()
        time.sleep(0.05)
    assert bus.run("g", 0)["phase"] == "Running" and bus.run("g", 1) is None

    b = ck_agents("i-1")
    run_until([a, b], lambda: all((r := bus.run("g", i)) and "found None" in r["log_tail"] for i in (0, 1)))  # (its handler set)
    place(2)  # a new epoch in place: round 1 (both ranks at 1) uploaded and restored
    run_until([a, b], lambda: all((r := bus.run("g", i)) and r["epoch"] == 2 and "found 1" in r["log_tail"] for i in (0, 1)))
    pid = b.replicas["g", 1].handle.pid
    b.replicas.clear()  # killed: it ticks no more, its rank runs on (adopted below)
    rec = run_until([a], lambda: (r := bus.run("g", 0)) and r["reason"] == "WaitingForGang" and r, timeout=20)  # before: Running on
    assert rec["attempt"] == 1 and "replica 1's agent on i-1 is lost" in rec["message"], rec

    back = ck_agents("i-1")  # the same instance's agent again: it adopts rank 1's process
    run_until([a, back], lambda: all((r := bus.run("g", i)) and r["phase"] == "Running" and r["attempt"] == 1 for i in (0, 1)), timeout=30)
    assert back.replicas["g", 1].handle.pid != pid  # restarted with the gang (GangRestart), not left running alone
    # A restart in place (the same assignment): each rank resumes from what it wrote at its signal, 2. (Before the
    # marker kept the assignment through rank 0's upload, rank 0 went back to round 1 while rank 1, which uploaded
    # nothing, kept its own 2.)
    assert run_until([a, back], lambda: all(got := [said(0, 1), said(1, 1)]) and got) == ["found 2", "found 2"]


def test_a_gang_rank_whose_peers_agent_died_before_taking_up_the_round_waits_naming_it_not_runs_alone(bus, ck_agents, monkeypatch):
    """Rank 1's agent dies (with its rank: the instance vanished) just before the gang's next epoch is published, so rank
    1 has no record of that round. Before, rank 0 waited for rank 1's old copy while its heartbeat was fresh, then
    started alone once it was stale (Running, hung in its first collective, nothing in status saying why) until the
    instance was replaced. Now the assignment names where each rank of the round runs (`peers`), and rank 0 judges
    rank 1 by that instance's agent, by the one stale rule: past it, WaitingForGang naming the lost agent, not run."""
    monkeypatch.setenv("FLEETOPS_HEARTBEAT_STALE_SECONDS", "1.5")

    def place(epoch: int, where: dict[int, str]) -> None:
        for r, inst in where.items():
            bus.put_assignment(inst, {"serial": epoch, "replicas": [entry("g", [PY, "-c", RANKED], replica=r, world=2, master=where[0],
                                                                          epoch=epoch, checkpoint=CK, mode="service", env={"CK_SECONDS": "0.2"},
                                                                          peers=[where[0], where[1]])]})

    a, b = ck_agents("i-0"), ck_agents("i-1")
    place(1, {0: "i-0", 1: "i-1"})
    run_until([a, b], lambda: all((r := bus.run("g", i)) and r["phase"] == "Running" for i in (0, 1)))
    for rep in b.replicas.values():  # i-1 vanishes: its rank and agent die before it reads epoch 2
        b.runtime.kill(rep.handle)
    b.replicas.clear()
    place(2, {0: "i-0", 1: "i-1"})
    # (60 s: a wait for a condition, over in ~1.6 s on an idle machine; the CI tier's two busy workers once took it past 20 s)
    rec = run_until([a], lambda: (r := bus.run("g", 0)) and r["epoch"] == 2 and (r["phase"] == "Running" or "is lost" in r["message"]) and r,
                    timeout=60)
    assert rec["reason"] == "WaitingForGang" and not a.replicas["g", 0].running, rec  # before: Running alone
    assert "replica 1's agent on i-1 is lost (no heartbeat since" in rec["message"] and "before it took up this round" in rec["message"], rec
    assert bus.run("g", 1)["epoch"] == 1
    for _ in range(10):
        a.tick()
    assert not a.replicas["g", 0].running  # it waits for the gang to be placed again

    c = ck_agents("i-2")
    bus.delete_assignment("i-1")
    place(3, {0: "i-0", 1: "i-2"})  # the reconciler replaces the lost instance
    run_until([a, c], lambda: all((r := bus.run("g", i)) and r["epoch"] == 3 and r["phase"] == "Running" for i in (0, 1)), timeout=30)


class CountingBackend(LocalBackend):
    """The real local backend, counting its calls by kind and top-level prefix ("LIST runs", "GET agents")."""

    def __init__(self, config_dir: Path):
        super().__init__(config_dir)
        self.calls: Counter[str] = Counter()

    def read_key(self, key: str) -> bytes | None:
        self.calls["GET " + key.split("/")[0]] += 1
        return super().read_key(key)

    def write_key(self, key: str, body: bytes) -> None:
        self.calls["PUT " + key.split("/")[0]] += 1
        super().write_key(key, body)

    def list_keys(self, prefix: str) -> list[str]:
        self.calls["LIST " + prefix.split("/")[0]] += 1
        return super().list_keys(prefix)

    def read_file(self, key: str, dest: Path, progress=None) -> bool:
        self.calls["READ_FILE " + key.split("/")[0]] += 1
        return super().read_file(key, dest, progress)


@pytest.mark.parametrize("per", [1, 8], ids=["16x1", "2x8"])
def test_a_16_rank_gangs_agents_read_the_round_by_key_once_a_poll_and_peer_reports_only_when_they_could_go_stale(tmp_path, monkeypatch, per):
    """Every rank listed runs/<job>/ and read each of its records every poll, and each peer instance's report: for 16
    ranks on 16 instances 16 LIST + 256 GET runs + 240 GET agents a poll (2 s), on 2 instances of 8 ranks 16 LIST +
    256 GET runs (each rank its own listing). S3 bills a LIST as 12 GETs and throttles a prefix past 5,500 GET/s, which
    a gang's runs/ prefix reaches at a few hundred ranks. Now each agent reads its gang's round once a poll, by key
    (no listing), its own ranks from memory, and a peer's report again only once it could be stale by the one rule."""
    monkeypatch.setenv("FLEETOPS_HEARTBEAT_STALE_SECONDS", "3600")  # (no report can go stale while a slow box starts 16 ranks)
    store = CountingBackend(tmp_path)
    bus = Bus(store)
    where = [f"i-{r // per}" for r in range(16)]
    for inst in sorted(set(where)):
        bus.put_assignment(inst, {"serial": 1, "replicas": [entry("g", ["sleep", "600"], replica=r, world=16, master="i-0", mode="service", peers=where)
                                                            for r in range(16) if where[r] == inst]})
    made = [Agent(i, bus, ProcessRuntime(), tmp_path / i, address="127.0.0.1", poll=0.05, heartbeat=3600, log=lambda m: None)
            for i in sorted(set(where))]
    try:
        run_until(made, lambda: all((r := bus.run("g", i)) and r["phase"] == "Running" for i in range(16)))
        for a in made:
            a.tick()
        store.calls.clear()
        for a in made:  # one poll of every agent, the gang running
            a.tick()
        n = len(made)
        per_poll = dict(store.calls)
        assert per_poll == {"GET assignments": n, "GET runs": n * (16 - per)}, per_poll  # before: above
    finally:
        for a in made:
            for rep in a.replicas.values():
                if rep.handle is not None:
                    a.runtime.kill(rep.handle)


def test_a_replica_whose_checkpoint_the_disk_has_no_room_for_waits_saying_so_and_fetches_nothing(tmp_path, monkeypatch):
    """The job's newest upload needs more free disk than the instance has. Before, the agent logged the failed
    downloads and started the replica anyway, from the older files its directory held (a gang: moved aside, from
    step 0), Running in status. Now it does not start it: Starting, NoRoomForCheckpoint, naming the job, the bytes
    needed and free; it tries again after the agent's restart delays (doubling) without fetching a file, and restores
    and starts once there is room."""
    from types import SimpleNamespace

    from reconciler.runtime import checkpoints

    store = CountingBackend(tmp_path)
    bus = Bus(store)
    src = tmp_path / "elsewhere" / "ckpt"
    src.mkdir(parents=True)
    (src / "model.bin").write_bytes(b"7" * 5000)
    checkpoints.upload(store, "ft", src, instance="i-9", spec_hash="h1", epoch=1, log=lambda m: None)
    free = [4000]
    monkeypatch.setattr(checkpoints, "disk_usage", lambda path: SimpleNamespace(total=10**12, used=10**12 - free[0], free=free[0]))
    cmd = [PY, "-c", "import os,time; p=os.path.join(os.environ['FLEETOPS_CHECKPOINT_DIR'], 'model.bin'); "
                     "print('found', os.path.getsize(p) if os.path.exists(p) else None, flush=True); time.sleep(600)"]
    bus.put_assignment("i-0", {"serial": 2, "replicas": [entry("ft", cmd, epoch=2, checkpoint=CK, mode="service")]})
    a = Agent("i-0", bus, ProcessRuntime(), tmp_path / "i-0", address="127.0.0.1", poll=0.05, heartbeat=0.2, backoff=0.2,
              checkpoint_root=tmp_path / "i-0" / "disk", log=lambda m: None, checkpoint_sync=True)
    try:
        rec = run_until([a], lambda: (r := bus.run("ft", 0)) and r["reason"] != "Assigned" and r)
        assert (rec["phase"], rec["reason"]) == ("Starting", "NoRoomForCheckpoint") and not a.replicas["ft", 0].running, rec  # before: Running
        assert "ft: " in rec["message"] and "needs 5000 bytes" in rec["message"] and "4000 free" in rec["message"], rec
        began = time.monotonic()
        while time.monotonic() - began < 1.0:
            a.tick()
            time.sleep(0.05)
        assert not a.replicas["ft", 0].running and store.calls["READ_FILE checkpoints"] == 0 and store.calls["LIST checkpoints"] <= 4, store.calls
        assert not (tmp_path / "i-0" / "disk" / "ft").exists()  # nothing staged, nothing made
        free[0] = 10**9  # room made
        rec = run_until([a], lambda: (r := bus.run("ft", 0)) and "found 5000" in r["log_tail"] and r)
        assert rec["phase"] == "Running", rec
    finally:
        for rep in a.replicas.values():
            if rep.handle is not None:
                a.runtime.kill(rep.handle)


def test_a_second_agent_on_one_instance_refuses_to_run_naming_the_first(tmp_path):
    """Two agents with one workdir (a manual `reconcile agent` beside the service, for a look): each adopted or started
    every replica assigned to the instance, two copies on the same GPUs, and both wrote its records. Now the second
    exits 1 at once, naming the first's pid (a lock on the workdir, released when the first dies however it ends)."""
    import subprocess

    from tests.fleetkit import ROOT

    cmd = [PY, "-m", "reconciler.cli", "agent", "i-0", "--dir", str(tmp_path), "--runtime", "process", "--address", "127.0.0.1",
           "--workdir", str(tmp_path / "w"), "--poll", "0.2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        beat = tmp_path / ".reconcile" / "agents" / "i-0.json"
        limit = time.monotonic() + 60
        while not beat.exists() and time.monotonic() < limit and first.poll() is None:
            time.sleep(0.1)
        assert beat.exists(), "the first agent never reported"
        second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=90)  # before: ran beside it (timed out)
        said = second.stdout + second.stderr
        assert second.returncode == 1 and f"another agent (pid {first.pid})" in said and "Traceback" not in said, said
    finally:
        first.terminate()
        first.wait(timeout=60)
    third = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)  # the first gone: runs
    try:
        time.sleep(1.5)
        assert third.poll() is None, third.stderr.read()
    finally:
        third.terminate()
        third.wait(timeout=60)


def test_a_peer_with_no_record_of_the_round_is_judged_by_the_agent_of_the_instance_it_is_assigned_to():
    """peer_lost over unstarted_peers: a rank of the round with no record of it is placed where the assignment's peers
    say; lost only when that instance's agent is, by the one stale rule (a running rank then stops, GangPeerLost)."""
    from reconciler.runtime.agent import peer_lost, unstarted_peers

    now, stale = 10_000.0, 60.0
    reports = {"i-1": {"heartbeat_at": now - 61, "state": "Ready"}, "i-2": {"heartbeat_at": now - 5, "state": "Ready"}}
    e = entry("g", ["x"], replica=0, world=4, peers=["i-0", "i-1", "i-2", "i-3"])
    mine = [{"replica": 0, "instance": "i-0", "spec_hash": "h1", "epoch": 1}]
    absent = unstarted_peers(e, mine)
    assert [(r["replica"], r["instance"]) for r in absent] == [(1, "i-1"), (2, "i-2"), (3, "i-3")]
    said = peer_lost(0, "i-0", mine + absent, reports.get, now, stale)
    assert said is not None and said.startswith("replica 1's agent on i-1 is lost (no heartbeat since") and said.endswith("before it took up this round")
    reports["i-1"]["heartbeat_at"] = now - 59  # within the limit: not lost; i-3 has no report (booting): not lost
    assert peer_lost(0, "i-0", mine + absent, reports.get, now, stale) is None
    assert unstarted_peers(entry("g", ["x"], replica=0, world=2), mine) == []  # an assignment from before peers: as before


@pytest.mark.parametrize("run, says", [
    ({"command": ["echo", "a\0b"], "env": {}}, "run.command[1] holds a NUL"),  # an older bus: before the config refused it
    ({"command": ["echo", "hi"], "env": {"TOKEN": "s3cret\0"}}, "run.env.TOKEN holds a NUL"),
    ({"command": ["echo", "hi"], "env": {"A=B": "1"}}, "run.env has a variable name 'A=B'"),
])
def test_a_replica_that_cannot_be_started_fails_naming_why_and_the_agent_runs_the_others(bus, agents, run, says):
    """One replica the bus holds in a form no process can take killed the whole agent (an 'unexpected ValueError:
    embedded null byte' from Popen) and left every job of its instance Starting."""
    bad = entry("bad", ["echo"])
    bad["run"] = run
    bus.put_assignment("i-0", {"serial": 1, "replicas": [bad, entry("good", [PY, "-c", "print('ok')"])]})
    a = agents("i-0")
    rec = run_until([a], terminal(bus, "bad"), timeout=10)
    assert (rec["phase"], rec["reason"], rec["restarts"]) == ("Failed", "StartError", 0), rec
    assert says in rec["message"] and "s3cret" not in rec["message"], rec["message"]
    good = run_until([a], terminal(bus, "good"), timeout=10)
    assert (good["phase"], good["log_tail"]) == ("Succeeded", ["ok"]), good


def test_a_checkpoint_directory_that_cannot_be_made_fails_its_replica_naming_it(bus, agents, tmp_path):
    (tmp_path / "disk").write_text("a file where the checkpoint root should be")
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("ck", [PY, "-c", "print(1)"], checkpoint=CK)]})
    rec = run_until([agents("i-0", checkpoint_root=tmp_path / "disk", checkpoint_sync=False)], terminal(bus, "ck"), timeout=10)
    assert (rec["phase"], rec["reason"]) == ("Failed", "StartError"), rec
    assert str(tmp_path / "disk") in rec["message"], rec["message"]


def test_a_command_directory_that_is_gone_fails_its_replicas_naming_it_and_the_agent_keeps_running(bus, tmp_path):
    gone = tmp_path / "cfg"
    a = Agent("i-0", bus, ProcessRuntime(), tmp_path / "i-0", address="127.0.0.1", poll=0.05, heartbeat=0.2, command_cwd=gone,
              log=lambda m: None)
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("prep", [PY, "-c", "print(1)"])]})
    rec = run_until([a], terminal(bus, "prep"), timeout=10)
    assert (rec["phase"], rec["reason"]) == ("Failed", "StartError"), rec
    assert str(gone) in rec["message"] and "directory" in rec["message"], rec["message"]


def test_a_local_record_it_cannot_write_keeps_the_replica_running_is_reported_and_written_once_it_can(bus, agents, tmp_path):
    """The agent's own files (the replica's local record, replicas.pids) cannot be written just after it started a
    replica (a full disk: here a directory where each file goes, which stops root too): the agent died with the OSError,
    its replica left running untracked. It keeps running, the agent's report names the path and errno, and each tick
    writes again: once it can, an agent restarted on the instance adopts the replica instead of starting a second copy.
    (Before the start its record could be written: one it cannot write then is not started, test_runtime_workdir.)"""
    work = tmp_path / "i-0"

    class DiskFailsAtTheStart(ProcessRuntime):
        def start(self, launch):
            handle = super().start(launch)
            (work / "replicas" / "sleep-0.json").unlink()
            (work / "replicas" / "sleep-0.json").mkdir()
            (work / "replicas.pids").mkdir()
            return handle

    a = agents("i-0")
    a.runtime = DiskFailsAtTheStart()
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("sleep", [PY, "-c", "import time; time.sleep(60)"])]})
    a.tick()
    rep = a.replicas[("sleep", 0)]
    assert rep.running and a.runtime.poll(rep.handle) is None
    a.tick()  # (the next tick retries, fails again, and does not die either)
    said = bus.agent("i-0")["workdir_failed"]
    assert str(work / "replicas" / "sleep-0.json") in said and "EISDIR" in said, said
    (work / "replicas" / "sleep-0.json").rmdir()
    (work / "replicas.pids").rmdir()
    a.tick()
    a._publish(force=True)
    assert "workdir_failed" not in bus.agent("i-0")
    assert json.loads((work / "replicas" / "sleep-0.json").read_text())["pid"] == rep.handle.pid
    assert (work / "replicas.pids").read_text().split()[0] == str(rep.handle.pid)
    again = agents("i-0")  # the agent restarted (systemd): the replica's process is adopted, not started twice
    again.tick()
    assert again.replicas[("sleep", 0)].reason == "Adopted" and again.replicas[("sleep", 0)].handle.pid == rep.handle.pid
    a.runtime.kill(rep.handle)


def test_a_notice_handled_whose_notice_done_cannot_be_written_is_reported_and_written_again(bus, agents, tmp_path):
    """notice.done (the sim waits for it to reclaim the instance) could not be written: the agent died in the notice."""
    from reconciler.runtime.notices import FileNotice

    notice, work = tmp_path / "notice.json", tmp_path / "i-0"
    notice.write_text(json.dumps({"reason": "spot-interruption", "time": "now"}))
    (work / "notice.done").mkdir(parents=True)
    a = agents("i-0", notice=FileNotice(notice))
    bus.put_assignment("i-0", {"serial": 1, "replicas": []})
    a.tick()
    a.tick()
    assert not a.notice_done and "notice.done: Is a directory (EISDIR" in bus.agent("i-0")["workdir_failed"]
    (work / "notice.done").rmdir()
    a.tick()
    assert a.notice_done and (work / "notice.done").is_file()


# A stand-in `docker` (sh: it answers at once, even on a loaded machine): `run` execs the command in place of a container
# (its pid recorded under the container's name, the --env it is given set), `kill [--signal S] NAME` signals that
# process. Every call is noted in STATE/calls; a `kill` naming a container listed in STATE/hang hangs (a docker daemon
# that does not answer) while the name stays listed.
FAKE_DOCKER = r'''
echo "$*" >> "$STATE/calls"
case "$1" in
run)
    shift
    while :; do
        case "$1" in
            --rm) shift ;;
            --name) name=$2; shift 2 ;;
            --env) case "$2" in *=*) export "$2" ;; esac; shift 2 ;;
            --*) shift 2 ;;
            *) break ;;
        esac
    done
    echo $$ > "$STATE/$name.pid"
    shift
    exec "$@" ;;
kill)
    if [ "$2" = --signal ]; then sig=${3#SIG}; name=$4; else sig=KILL; name=$2; fi
    while [ -f "$STATE/hang" ] && grep -qx "$name" "$STATE/hang"; do sleep 0.05; done
    kill -s "$sig" "$(cat "$STATE/$name.pid")" 2>/dev/null || { echo "Error response from daemon: No such container: $name" >&2; exit 1; } ;;
esac
'''


def fake_docker(tmp_path: Path) -> tuple[Path, Path]:
    """FAKE_DOCKER in tmp_path/bin/docker, and the directory of its state (calls, hang, pids)."""
    state, exe = tmp_path / "docker-state", tmp_path / "bin" / "docker"
    state.mkdir()
    exe.parent.mkdir()
    exe.write_text(f"#!/bin/sh\nSTATE={shlex.quote(str(state))}\n" + FAKE_DOCKER)
    exe.chmod(0o755)
    return exe, state


def test_a_notice_signals_every_container_at_once_and_kills_one_docker_does_not_answer_for(bus, tmp_path):
    """A spot notice on an instance with three containers, its docker daemon hung for the first one (`docker kill`
    does not answer). The agent sent each container its checkpoint signal by `docker kill --signal`, one after another,
    each waited for up to 30 s: the other two got theirs half a minute into the notice (GCP and Azure give 30 s, AWS
    2 minutes), and the kill after the grace waited 30 s per container again. Now every signal goes at once, each call
    bounded by the replica's grace (its kill begins then), and a container docker does not kill within the kill's margin
    is ended through its client's process group."""
    from reconciler.runtime.notices import FileNotice

    docker, state = fake_docker(tmp_path)
    (state / "hang").write_text("fleetops-c0-0-0\n")
    notes, notice = tmp_path / "notes", tmp_path / "notice.json"
    ck = {"dir": str(tmp_path / "ck"), "signal": "SIGTERM", "grace_seconds": 2}
    bus.put_assignment("i-0", {"serial": 1, "replicas": [
        {**noted(f"c{i}", notes, checkpoint_seconds=0.2), "run": {"image": "img", "command": [PY, "-c", NOTED],
                                                                  "env": {"NOTES": str(notes), "TAG": f"c{i}", "CHECKPOINT_SECONDS": "0.2"}},
         "checkpoint": ck} for i in range(3)]})
    a = Agent("i-0", bus, DockerRuntime(docker=str(docker)), tmp_path / "i-0", address="127.0.0.1", poll=0.05, heartbeat=0.2,
              log=lambda m: None, checkpoint_sync=False, notice=FileNotice(notice))
    try:
        run_until([a], noted_at(notes, *((f"c{i}", "start") for i in range(3))))
        notice.write_text(json.dumps({"reason": "spot-interruption", "time": "now"}))
        at = time.time()
        n = run_until([a], noted_at(notes, ("c1", "exit"), ("c2", "exit")), timeout=60)
        # (before: 30 s into the notice, a GCP or Azure notice's whole length; a loaded host takes a second or two)
        assert max(n["c1", "checkpointing"], n["c2", "checkpointing"]) - at < 5.0, n
        run_until([a], lambda: a.notice_done, timeout=30)
        took = time.time() - at
        assert ("c0", "checkpointing") not in notes_of(notes)  # (its signal never came through)
        recs = {i: bus.run(f"c{i}", 0) for i in range(3)}
        assert [(r["phase"], r["reason"]) for r in recs.values()] == [("Stopped", "Interrupted")] * 3, recs
        assert recs[0]["exit_code"] == -9 and recs[1]["exit_code"] == recs[2]["exit_code"] == 0, recs
        assert took < 2 + 5 + 2, took  # its grace, the kill's margin (STRAY_GRACE_S + KILL_MARGIN_S), a poll's slack
    finally:
        (state / "hang").unlink(missing_ok=True)
        for rep in a.replicas.values():
            if rep.handle is not None:
                a.runtime.kill(rep.handle)


class SlowCheckpointReads(LocalBackend):
    """The real local backend whose checkpoint file reads each take `delay` s (a checkpoint of GBs, a slow link); the
    first of them writes the spot notice `notice` (one arriving while a restore runs) and notes when in `noticed`."""

    delay, notice, noticed = 0.5, None, None

    def read_file(self, key: str, dest: Path, progress=None) -> bool:
        if self.notice is not None and self.noticed is None:
            self.notice.write_text(json.dumps({"reason": "spot-interruption", "time": "now"}))
            self.noticed = time.time()
        time.sleep(self.delay)
        return super().read_file(key, dest, progress)


def test_a_notice_arriving_while_a_checkpoint_is_restored_signals_the_running_replicas_at_once(tmp_path):
    """A replica starts on an instance where another runs, and its checkpoint is restored first, in the agent's loop
    (GBs take minutes). A spot notice arriving meanwhile was seen only once the restore was over: the running replica
    got its checkpoint signal that much later into the notice (GCE and Azure give 30 s), and the restored one was
    started, inside the notice, to be stopped again. Now the restore's progress calls (the heartbeat's) look at the
    notice too: the running replica is signalled at once, and the restored one is not started."""
    from reconciler.runtime import checkpoints
    from reconciler.runtime.notices import FileNotice

    store = SlowCheckpointReads(tmp_path)
    bus = Bus(store)
    src = tmp_path / "elsewhere" / "ckpt"
    src.mkdir(parents=True)
    for i in range(8):
        (src / f"shard-{i}.bin").write_bytes(b"7" * 1000)
    checkpoints.upload(store, "ft", src, instance="i-9", spec_hash="h1", epoch=1, log=lambda m: None)
    notes, notice = tmp_path / "notes", tmp_path / "notice.json"
    running = noted("run", notes, checkpoint_seconds=0.2, grace=10)
    restored = entry("ft", [PY, "-c", "print('started', flush=True); import time; time.sleep(600)"], epoch=2, checkpoint=CK,
                     mode="service")
    bus.put_assignment("i-0", {"serial": 1, "replicas": [running]})
    a = Agent("i-0", bus, ProcessRuntime(), tmp_path / "i-0", address="127.0.0.1", poll=0.05, heartbeat=0.2, backoff=0.1,
              checkpoint_root=tmp_path / "i-0" / "disk", log=lambda m: None, checkpoint_sync=True, notice=FileNotice(notice))
    try:
        run_until([a], noted_at(notes, ("run", "start")))
        store.notice = notice
        bus.put_assignment("i-0", {"serial": 2, "replicas": [running, restored]})
        n = run_until([a], noted_at(notes, ("run", "checkpointing")))
        assert n["run", "checkpointing"] - store.noticed < 2.0, n  # before: after the whole restore, 8 x 0.5 s
        run_until([a], lambda: a.notice_done, timeout=30)
        rec = bus.run("ft", 0)
        assert (rec["phase"], rec["reason"]) == ("Stopped", "Interrupted") and rec["started_at"] is None, rec  # never started
        assert bus.run("run", 0)["exit_code"] == 0
    finally:
        for rep in a.replicas.values():
            if rep.handle is not None:
                a.runtime.kill(rep.handle)
