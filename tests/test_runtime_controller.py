"""`reconcile controller --pull`: the controller follows the config repo. A commit pushed to the
remote is pulled and applied; a pushed config that does not validate, or a pull that fails, is
logged and the fleet is kept as it is. Real git repositories (a bare remote and clones), the sim."""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path

from providers.sim import SimCloud
from reconciler.runtime.controller import Controller
from reconciler.state import state_dir
from tests.fleetkit import job, pool, report_written_ago, tenant, topology, write_config


def git(cwd: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(cwd), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def fleet_docs(*jobs: dict) -> list[dict]:
    return [topology(), tenant("t"), pool("cpu", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], hi=4), *jobs]


def push(work: Path, message: str) -> None:
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", message)
    git(work, "push", "-q", "origin", "HEAD:main")


def pushed_and_cloned(tmp_path: Path) -> tuple[Path, Path]:
    """A bare remote holding one commit of a one-job fleet (in its `fleet/` directory), pushed from an author's clone;
    (the author's clone, the controller's clone)."""
    remote, author, cfg = tmp_path / "remote.git", tmp_path / "author", tmp_path / "controller"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(remote)], check=True, timeout=60)
    subprocess.run(["git", "clone", "-q", str(remote), str(author)], check=True, timeout=60, capture_output=True)
    (author / ".gitignore").write_text(".reconcile/\nstatus/\n")
    write_config(author / "fleet", fleet_docs(job("a", cpu=15)))
    push(author, "one job")
    subprocess.run(["git", "clone", "-q", str(remote), str(cfg)], check=True, timeout=60, capture_output=True)
    return author, cfg


def live(cfg: Path) -> int:
    return sum(1 for i in SimCloud(state_dir(cfg)).instances() if i["state"] != "terminated")


def test_the_controller_pulls_the_config_repo_and_applies_what_was_pushed(tmp_path):
    author, cfg = pushed_and_cloned(tmp_path)
    logs: list[str] = []
    ctl = Controller(cfg / "fleet", time_limit=5, pull=True, log=logs.append)  # the config is a directory of the repo
    assert ctl.step() and live(cfg / "fleet") == 1

    # A second job is pushed: the next wake-up pulls it and applies it.
    write_config(author / "fleet", fleet_docs(job("a", cpu=15), job("b", cpu=15)))
    push(author, "second job")
    assert ctl.step(), logs
    assert any(m.startswith("the desired state changed: plan") for m in logs), logs
    assert live(cfg / "fleet") == 2 and (cfg / "fleet" / "fleet.yaml").read_text() == (author / "fleet" / "fleet.yaml").read_text()

    # A pushed config that does not validate is pulled, logged and not acted on: the fleet stays.
    (author / "fleet" / "fleet.yaml").write_text((author / "fleet" / "fleet.yaml").read_text().replace("cpu: 15", "cpu: many", 1))
    push(author, "broken")
    assert not ctl.step()
    assert "the config does not validate" in logs[-1] and "fleet.yaml" in logs[-1], logs[-1]
    assert live(cfg / "fleet") == 2

    # The remote cannot be reached: the controller says so and keeps watching what it has.
    git(cfg, "remote", "set-url", "origin", str(tmp_path / "gone.git"))
    n = len(logs)
    assert not ctl.step()
    assert any(m.startswith("git pull failed:") for m in logs[n:]), logs[n:]
    assert live(cfg / "fleet") == 2


def test_a_refused_apply_is_retried_with_a_backoff_not_every_poll(tmp_path):
    """A guardrail refuses the apply (3 deletes, 1 allowed). Before, a failed apply set the last plan's time to 0:
    the controller planned (and failed) at every poll, 60 times a minute at --poll 1, a core's worth on a 10k-job
    fleet. Now it tries again after 2, 4, 8 ... s (capped at --resync), and at once when the config changes."""
    from tests.fleetkit import doc

    guard = doc("GuardrailPolicy", "g", {"max_destroy_per_apply": 1})
    cfg = write_config(tmp_path / "fleet", [*fleet_docs(job("a", cpu=15), job("b", cpu=15), job("c", cpu=15)), guard])
    now = [1000.0]
    logs: list[str] = []
    ctl = Controller(cfg, time_limit=5, poll=1, resync=60, log=logs.append, clock=lambda: now[0])
    assert ctl.step() and live(cfg) == 3
    write_config(cfg, [*fleet_docs(), guard])  # every job gone: 3 instances to delete
    failed_at = []
    for _ in range(180):  # three minutes of 1 s polls
        n = len(logs)
        ctl.step()
        failed_at += [now[0] for m in logs[n:] if m.startswith("apply of plan")]
        now[0] += 1
    assert live(cfg) == 3 and "max_destroy_per_apply" in next(m for m in logs if m.startswith("apply of plan"))
    gaps = [b - a for a, b in itertools.pairwise(failed_at)]
    assert gaps[:5] == [2, 4, 8, 16, 32] and set(gaps[5:]) == {60}, failed_at  # before: 180 attempts, 1 s apart

    # The config changes (the limit raised): planned and applied at the next poll, not after the backoff.
    write_config(cfg, [*fleet_docs(), doc("GuardrailPolicy", "g", {"max_destroy_per_apply": 5})])
    assert ctl.step() and live(cfg) == 0


def test_a_replaced_instance_calls_for_no_second_plan(tmp_path, monkeypatch):
    """An instance whose agent went silent is replaced at once; the next wake-up then saw its entry gone from the
    agents' reports and planned again, logged as "jobs finished: : plan ...: no changes" (after every replacement).
    Only what is new in the reports (an instance to replace, a job that finished) calls for a plan."""
    from reconciler.backend import backend_for
    from reconciler.runtime.bus import Bus, now_unix

    monkeypatch.setenv("FLEETOPS_SIM_AGENTS", "0")  # (the test plays the agent: a heartbeat an hour old)
    cfg = write_config(tmp_path / "fleet", fleet_docs(job("a", cpu=15, mode="service", run={"command": ["sleep", "1000"]})))
    now = [1000.0]
    logs: list[str] = []
    ctl = Controller(cfg, time_limit=5, poll=1, resync=60, log=logs.append, clock=lambda: now[0])
    assert ctl.step()
    iid = backend_for(cfg).load().placements["a"][0]
    Bus(backend_for(cfg)).put_agent(iid, {"instance": iid, "heartbeat_at": now_unix() - 3600, "state": "Ready", "running": ["a/0"]})
    report_written_ago(cfg, iid, 3600)
    assert ctl.step() and any(m.startswith(f"replace {iid}: lost node") for m in logs), logs
    # (and why the instance went, after the apply: its work is elsewhere)
    gone = next(m for m in logs if m.startswith(f"  deleted {iid}: "))
    assert "lost node" in gone and logs[logs.index(gone) - 1].startswith("applied plan"), logs
    n = len(logs)
    for _ in range(5):
        now[0] += 1
        assert not ctl.step()
    assert logs[n:] == [], logs[n:]  # before: ['jobs finished: : plan ...: no changes']


def test_a_pull_that_hangs_is_given_up_and_sigterm_is_not_held_by_it(tmp_path):
    """A remote that accepts the connection and never answers (a black-holed network, an ssh host key or password
    prompt): `git pull` ran without a time limit, so the controller hung in it, planned nothing, reacted to no
    interruption, and SIGTERM did not stop it (a controller with `core.sshCommand` sleeping 300 s still ran 20 s
    after SIGTERM, and had not planned at all). Now a pull is given up after `pull_timeout` seconds (git and what
    it started, killed), the controller plans from what it has, and a stop asked for during a pull ends it at once."""
    import threading
    import time

    remote, cfg = tmp_path / "remote.git", tmp_path / "controller"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(remote)], check=True, timeout=60)
    subprocess.run(["git", "clone", "-q", str(remote), str(cfg)], check=True, timeout=60, capture_output=True)
    (cfg / ".gitignore").write_text(".reconcile/\nstatus/\n")
    write_config(cfg / "fleet", fleet_docs(job("a", cpu=15)))
    push(cfg, "one job")
    hang, pids = tmp_path / "hang.sh", tmp_path / "pids"
    hang.write_text(f"#!/bin/sh\necho $$ >> {pids}\nexec sleep 30\n")
    hang.chmod(0o755)
    git(cfg, "config", "core.sshCommand", str(hang))
    git(cfg, "remote", "set-url", "origin", "ssh://fleet-config.invalid/fleet.git")

    logs: list[str] = []
    ctl = Controller(cfg / "fleet", time_limit=5, pull=True, log=logs.append)
    ctl.pull_timeout = 2
    t0 = time.monotonic()
    assert ctl.step(), logs  # the pull given up, the fleet planned and applied from the config it has
    assert time.monotonic() - t0 < 20, logs  # before: 30 s or more, in the pull
    assert any(m.startswith("git pull failed: no answer in 2s") for m in logs), logs
    assert live(cfg / "fleet") == 1

    # SIGTERM during a pull (here with no time limit to speak of): run() returns at once.
    ctl.pull_timeout = 600
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    t0 = time.monotonic()
    ctl.run(stop.is_set)
    assert time.monotonic() - t0 < 15, logs  # before: until the stand-in's 30 s were up
    assert "git pull stopped" in "\n".join(logs) and logs[-1].startswith("stopped after"), logs
    time.sleep(0.5)
    for pid in map(int, pids.read_text().split()):  # nothing git started is left behind
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue
        # (killed, it may linger as a zombie until its new parent reaps it: a container whose init reaps nothing)
        assert state in ("Z", "X"), f"the hung ssh stand-in {pid} still runs (state {state})"


def test_sigterm_during_a_controller_apply_stops_it_between_actions(tmp_path, monkeypatch):
    """SIGTERM (a stopped pod, a systemd unit) in the middle of the controller's apply: the controller let the apply
    run to its end (27 s after SIGTERM for 10 creates at 3 s each on the sim), where `reconcile apply` stops between
    actions; a pod is killed 30 s after SIGTERM, mid-apply, its lock and state left as they were. Now the controller
    stops its apply as `reconcile apply` does: no further action starts, status is written, the lock released."""
    from providers.sim import SimProvider

    cfg = write_config(tmp_path / "fleet", fleet_docs(job("a", cpu=15), job("b", cpu=15), job("c", cpu=15)))
    stop = {"now": False}
    create = SimProvider.create

    def create_then_sigterm(self, request):
        stop["now"] = True  # SIGTERM arrives while the first instance is being created
        return create(self, request)

    monkeypatch.setattr(SimProvider, "create", create_then_sigterm)
    logs: list[str] = []
    ctl = Controller(cfg, time_limit=5, poll=1, log=logs.append)
    ctl.run(lambda: stop["now"])
    assert live(cfg) == 1, logs  # before: 3, the whole apply
    assert any(m.startswith("stopped plan") and "2 action(s) not started" in m for m in logs), logs
    assert logs[-1].startswith("stopped after"), logs
    assert not (state_dir(cfg) / "apply.lock").exists()


def test_a_pull_is_not_stopped_for_ever_by_the_controllers_own_copy_of_a_tracked_status_dir(tmp_path):
    """examples/gitops commits status/ (CI's `apply --commit`). The controller's own applies rewrite it, and once a
    pushed commit touched status/ too, `git pull --ff-only` refused at every poll ("Your local changes ... would be
    overwritten"): no config change was pulled again. status/ is the reconciler's output: the controller's copy yields
    to what was committed; a local edit of the config itself still stops the pull (nothing else is touched)."""
    remote, author, cfg = tmp_path / "remote.git", tmp_path / "author", tmp_path / "controller"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(remote)], check=True, timeout=60)
    subprocess.run(["git", "clone", "-q", str(remote), str(author)], check=True, timeout=60, capture_output=True)
    (author / ".gitignore").write_text(".reconcile/\n")
    write_config(author / "fleet", fleet_docs(job("a", cpu=15)))
    (author / "fleet" / "status").mkdir()
    # (a status document as apply writes one, before any uid: an empty or metadata-less fleet.yaml is refused as
    # unreadable where the state records no uid, s38-ident)
    (author / "fleet" / "status" / "fleet.yaml").write_text("metadata: {}\ncommitted: 1\n")
    push(author, "one job, status committed")
    subprocess.run(["git", "clone", "-q", str(remote), str(cfg)], check=True, timeout=60, capture_output=True)
    logs: list[str] = []
    ctl = Controller(cfg / "fleet", time_limit=5, pull=True, log=logs.append)
    assert ctl.step() and live(cfg / "fleet") == 1  # its apply rewrote status/fleet.yaml (and wrote new status files)
    assert (cfg / "fleet" / "status" / "fleet.yaml").read_text() != "metadata: {}\ncommitted: 1\n"

    # CI applied and committed status/ (a file the controller also wrote, untracked here, among it), and a job is added.
    (author / "fleet" / "status" / "fleet.yaml").write_text("committed: 2\n")
    (author / "fleet" / "status" / "metrics.prom").write_text("# committed\n")
    write_config(author / "fleet", fleet_docs(job("a", cpu=15), job("b", cpu=15)))
    push(author, "second job; status from CI")
    n = len(logs)
    assert ctl.step(), logs[n:]
    assert not any(m.startswith("git pull failed") for m in logs[n:]), logs[n:]
    assert any(m.startswith("status/ as committed upstream replaces") for m in logs[n:]), logs[n:]
    assert live(cfg / "fleet") == 2 and (cfg / "fleet" / "fleet.yaml").read_text() == (author / "fleet" / "fleet.yaml").read_text()

    # A local edit of the config (not status/) still stops the pull: it is someone's, not the reconciler's output.
    (cfg / "fleet" / "fleet.yaml").write_text((cfg / "fleet" / "fleet.yaml").read_text() + "\n# local edit\n")
    (author / "fleet" / "fleet.yaml").write_text((author / "fleet" / "fleet.yaml").read_text() + "\n# upstream edit\n")
    push(author, "upstream edit")
    n = len(logs)
    ctl.step()
    assert any(m.startswith("git pull failed") for m in logs[n:]), logs[n:]
    assert "# local edit" in (cfg / "fleet" / "fleet.yaml").read_text()


def test_a_force_push_that_takes_commits_back_is_followed_but_a_local_commit_is_not_dropped(tmp_path):
    """A team takes a bad commit back with a force-push (the usual GitOps rollback). `git pull --ff-only` then said
    "Already up to date" (the checkout is ahead) or "Not possible to fast-forward" (diverged), and the controller kept
    enforcing the commit upstream no longer has, logging at every poll. Commits that were upstream's (its
    remote-tracking ref's reflog holds them) are upstream's to take back: the controller follows it. A commit made in
    the checkout itself, never pulled, is someone's work: it is kept, said once."""
    author, cfg = pushed_and_cloned(tmp_path)
    logs: list[str] = []
    now = [1000.0]
    ctl = Controller(cfg / "fleet", time_limit=5, pull=True, log=logs.append, clock=lambda: now[0])
    assert ctl.step() and live(cfg / "fleet") == 1
    write_config(author / "fleet", fleet_docs(job("a", cpu=15), job("b", cpu=15)))
    push(author, "second job (bad)")
    assert ctl.step() and live(cfg / "fleet") == 2

    # Taken back: upstream is one commit behind the checkout.
    git(author, "reset", "-q", "--hard", "HEAD~1")
    git(author, "push", "-q", "--force", "origin", "HEAD:main")
    n = len(logs)
    assert ctl.step(), logs[n:]
    assert any("force-push" in m for m in logs[n:]), logs[n:]
    assert git(cfg, "rev-parse", "HEAD") == git(author, "rev-parse", "HEAD") and live(cfg / "fleet") == 1

    # Rewritten on another line: the checkout and upstream diverged.
    write_config(author / "fleet", fleet_docs(job("a", cpu=15), job("b", cpu=15)))
    push(author, "b again")
    assert ctl.step() and live(cfg / "fleet") == 2
    git(author, "reset", "-q", "--hard", "HEAD~1")
    write_config(author / "fleet", fleet_docs(job("a", cpu=15), job("c", cpu=15), job("d", cpu=15)))
    push_force = ["push", "-q", "--force", "origin", "HEAD:main"]
    git(author, "add", "-A")
    git(author, "commit", "-q", "-m", "c and d instead")
    git(author, *push_force)
    n = len(logs)
    assert ctl.step(), logs[n:]
    assert not any(m.startswith("git pull failed") for m in logs[n:]), logs[n:]
    assert git(cfg, "rev-parse", "HEAD") == git(author, "rev-parse", "HEAD") and live(cfg / "fleet") == 3

    # A commit of the checkout's own is not upstream's: kept, and said once, not at every poll.
    (cfg / "fleet" / "fleet.yaml").write_text((cfg / "fleet" / "fleet.yaml").read_text() + "\n# a local commit\n")
    git(cfg, "commit", "-q", "-am", "local")
    mine = git(cfg, "rev-parse", "HEAD")
    n = len(logs)
    for _ in range(3):
        now[0] += 2
        ctl.step()
    assert git(cfg, "rev-parse", "HEAD") == mine
    said = [m for m in logs[n:] if "not on origin/main" in m]
    assert len(said) == 1, logs[n:]


def test_a_config_that_does_not_validate_is_said_once_not_at_every_poll(tmp_path):
    """The controller logged the same "does not validate" line at every poll (every 2 s, for as long as the config
    stayed broken); it says it again only when the error changes or a resync period passed."""
    from tests.fleetkit import doc

    cfg = write_config(tmp_path / "fleet", [*fleet_docs(job("a", cpu=15))])
    now = [1000.0]
    logs: list[str] = []
    ctl = Controller(cfg, time_limit=5, poll=2, resync=60, log=logs.append, clock=lambda: now[0])
    assert ctl.step()
    write_config(cfg, [*fleet_docs(job("a", cpu="many"))])
    for _ in range(10):
        now[0] += 2
        ctl.step()
    assert sum("does not validate" in m for m in logs) == 1, logs
    write_config(cfg, [*fleet_docs(job("a", cpu=15)), doc("Nonsense", "x", {})])  # another error: said
    now[0] += 2
    ctl.step()
    assert sum("does not validate" in m for m in logs) == 2, logs
    now[0] += 61  # and again after a resync period, while it stands
    ctl.step()
    assert sum("does not validate" in m for m in logs) == 3, logs


def test_a_pull_error_naming_a_signed_remote_url_is_logged_redacted(tmp_path):
    """Secrets audit: git's error names the remote URL, and the controller logged it as is; git strips user:password@
    but keeps a query string (a signed URL's sig=). Logged redacted, as every other error."""
    cfg = write_config(tmp_path / "repo" / "fleet", fleet_docs(job("a", cpu=15)))
    subprocess.run(["git", "init", "-q", "-b", "main", str(tmp_path / "repo")], check=True, timeout=60)
    git(tmp_path / "repo", "add", "-A")
    git(tmp_path / "repo", "commit", "-q", "-m", "one")
    git(tmp_path / "repo", "remote", "add", "origin", "https://127.0.0.1:9/fleet.git?sv=2024&sig=PLANTED-signature")
    git(tmp_path / "repo", "config", "branch.main.remote", "origin")
    git(tmp_path / "repo", "config", "branch.main.merge", "refs/heads/main")
    logs: list[str] = []
    Controller(cfg, time_limit=5, pull=True, log=logs.append, pull_timeout=20).step()
    failed = [m for m in logs if m.startswith("git pull failed")]
    assert failed and not any("PLANTED" in m for m in logs), logs
