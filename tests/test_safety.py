"""Hostile and careless input (issue 15): parser limits, odd files in the config dir, status
written through links, corrupt state files, lock races, secrets in URLs. Every case goes
through the real CLI (its own process where the process is the point, else in this one: `cli_here`) and must end in a
clear error (exit 1), never a traceback or a crash."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fleetkit import copy_quickstart

RECONCILE = [sys.executable, "-m", "reconciler.cli"]


def cli(*args, env: dict | None = None, timeout: float = 120, memory: int | None = None) -> subprocess.CompletedProcess:
    """`reconcile ARGS` in its own process: a crash (SIGSEGV) or a traceback shows as what it is. With `memory`, its
    address space is capped at that many bytes (a read that would run the machine out of memory ends in a MemoryError)."""
    def cap() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    return subprocess.run([*RECONCILE, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, preexec_fn=cap if memory else None)


def cli_here(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    """`reconcile ARGS` in this process (click's runner, `env` set for the call): the commands and their error handling
    as `cli` runs them, without a process start (~0.8 s of CPU each). An exception the CLI let through comes back as the
    traceback a process would print, so `assert_clean_error` still sees it. `cli` stays where the process is the point:
    a crash, its peak memory, a read that could hang (a fifo: its timeout), the pid a temporary file is named after."""
    import traceback

    from typer.testing import CliRunner

    from reconciler.cli import app

    res = CliRunner().invoke(app, [str(a) for a in args], env=env)
    stderr = res.stderr
    if res.exc_info is not None and not isinstance(res.exception, SystemExit):
        stderr += "Traceback (most recent call last):\n" + "".join(traceback.format_exception(*res.exc_info))
    return subprocess.CompletedProcess(list(args), res.exit_code, res.stdout, stderr)


def assert_clean_error(res: subprocess.CompletedProcess, *needles: str) -> None:
    assert res.returncode == 1, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr, res.stderr
    for n in needles:
        assert n in res.stderr, (n, res.stderr)


# -- 7. parser limits ------------------------------------------------------------------------

def test_deep_nesting_is_a_file_line_error_not_a_crash(tmp_path):
    cfg = copy_quickstart(tmp_path)
    (cfg / "deep.yaml").write_text("a: " + "[" * 25_000 + "]" * 25_000 + "\n")  # 50 KB
    for cmd in ("validate", "plan"):
        assert_clean_error(cli(cmd, cfg), "deep.yaml:1: YAML nested more than 64 deep")


def test_millions_of_tiny_nodes_are_refused_while_parsing(tmp_path):
    cfg = copy_quickstart(tmp_path)
    (cfg / "wide.yaml").write_text("a:\n" + "- 1\n" * 975_000)  # 3.9 MB, under the size cap
    # Peak memory of the refusing process (the C composer built all 975k nodes first: ~400 MB more).
    # VmHWM, not ru_maxrss: that one keeps the forking test worker's peak across exec.
    probe = ("import re, sys\nfrom reconciler.cli import app\n"
             "try:\n    app(['validate', sys.argv[1]])\nexcept SystemExit as e:\n"
             "    hwm = int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n"
             "    print('exit', e.code, hwm // 1024, file=sys.stderr)\n")
    res = subprocess.run([sys.executable, "-c", probe, str(cfg)], capture_output=True, text=True, timeout=300)
    # Refused at the 200,001st node (the mapping, `a` and the list are 3: item 199,998 on line 199,999),
    # not after composing the whole file.
    assert "wide.yaml:199999: more than 200,000 YAML nodes" in res.stderr, res.stderr
    code, peak_mib = res.stderr.strip().splitlines()[-1].split()[1:]
    assert code == "1" and int(peak_mib) < 300, res.stderr


def test_oversized_file_is_refused_before_parsing(tmp_path):
    cfg = copy_quickstart(tmp_path)
    (cfg / "big.yaml").write_text("# padding\n" * 450_000)  # 4.5 MB of comments
    assert_clean_error(cli_here("validate", cfg), "big.yaml:1: file is larger than 4 MiB")


# -- 2. odd paths in the config dir; status never written through a link -------------------

def _live(cfg: Path) -> list[str]:
    from providers.sim import SimCloud
    from reconciler.state import state_dir

    return sorted(i["id"] for i in SimCloud(state_dir(cfg)).instances() if i["state"] != "terminated")


@pytest.fixture
def applied(applied_once, tmp_path) -> Path:
    """The quickstart, applied on the sim cloud (10 instances): a private copy of the module's one apply (each apply
    took ~2.3 s, fifteen times a run)."""
    cfg = tmp_path / "quickstart"
    shutil.copytree(applied_once, cfg)
    return cfg


def test_symlinked_jobs_dir_outside_is_an_error_and_nothing_is_deleted(applied, tmp_path):
    before = _live(applied)
    (applied / "jobs").rename(tmp_path / "shared-jobs")
    (applied / "jobs").symlink_to(tmp_path / "shared-jobs")
    for args in (("plan", applied), ("apply", applied, "--auto-approve")):
        assert_clean_error(cli_here(*args), "jobs:1: symlink points outside the config directory")
    assert _live(applied) == before  # the jobs did not vanish: their 6 instances still run


def test_symlinked_dir_inside_the_config_dir_is_followed(applied):
    (applied / ".shared").mkdir()
    (applied / "jobs").rename(applied / ".shared" / "jobs")
    (applied / "jobs").symlink_to(Path(".shared") / "jobs")
    (applied / "again").symlink_to(Path("."))  # a link back to the root adds nothing (read once)
    res = cli_here("plan", applied, "--detailed-exitcode")
    assert res.returncode == 0 and "No changes" in res.stdout, (res.stdout, res.stderr)


@pytest.mark.parametrize("case", ["loop", "dangling", "fifo", "unreadable"])
def test_unreadable_entries_are_file_errors_not_skipped(applied, case):
    before = _live(applied)
    jobs = applied / "jobs"
    if case == "loop":
        (jobs / "a").symlink_to("b")
        (jobs / "b").symlink_to("a")
        expect = "jobs/a:1: a symlink loop (b)"
    elif case == "dangling":
        (jobs / "more.yaml").symlink_to("gone.yaml")
        expect = "jobs/more.yaml:1: a dangling symlink (gone.yaml)"
    elif case == "fifo":
        os.mkfifo(jobs / "extra.yaml")  # a read would block forever
        expect = "jobs/extra.yaml:1: not a regular file"
    else:
        if os.geteuid() == 0:
            pytest.skip("root reads every file")
        (jobs / "platform.yaml").chmod(0)
        expect = "jobs/platform.yaml:1: cannot read: Permission denied"
    for args in (("validate", applied), ("apply", applied, "--auto-approve")):
        assert_clean_error(cli(*args, timeout=60) if case == "fifo" else cli_here(*args), expect)  # (a fifo read hangs)
    assert _live(applied) == before


def test_status_is_never_written_through_a_symlink(applied, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    job_file = next((applied / "status" / "jobs").glob("*.yaml"))
    job_file.unlink()
    job_file.symlink_to(victim)
    (applied / "jobs" / "platform.yaml").write_text((applied / "jobs" / "platform.yaml").read_text().replace("cpu: 14", "cpu: 13"))
    before = _live(applied)
    res = cli_here("apply", applied, "--auto-approve")
    assert_clean_error(res, f"status/jobs/{job_file.name} is a symlink (to {victim})", "Remove or move it away")
    assert victim.read_text() == "precious\n" and _live(applied) == before  # refused before any change

    # status/ itself a link to a directory outside: nothing written there, nothing deleted there.
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "keep.yaml").write_text("mine: true\n")
    job_file.unlink()
    (applied / "status").rename(tmp_path / "old-status")
    (applied / "status").symlink_to(outside)
    for args in (("apply", applied, "--auto-approve"), ("status", applied)):
        assert_clean_error(cli_here(*args), "status is a symlink", "Remove or move it away")
    assert [p.name for p in outside.iterdir()] == ["keep.yaml"] and _live(applied) == before


def test_metrics_prom_is_never_written_through_a_planted_link(tmp_path):
    """Audit: apply wrote status/metrics.prom through `status/.metrics.prom.<pid>.tmp` with a plain write, so a link
    committed at that name (pids are predictable on CI) had a file outside the repo overwritten. The link is planted
    here for the very pid the apply runs as (the shell's: exec keeps it)."""
    cfg = copy_quickstart(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (cfg / "status").mkdir()
    res = subprocess.run(["sh", "-c", 'ln -s "$1" "$2/status/.metrics.prom.$$.tmp" && exec "$3" -m reconciler.cli apply "$2" '
                                      "--auto-approve", "sh", str(victim), str(cfg), sys.executable],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert victim.read_text() == "precious\n"
    assert (cfg / "status" / "metrics.prom").read_text().startswith("# HELP fleetops_")
    assert not [p.name for p in (cfg / "status").iterdir() if p.name.endswith(".tmp") and not p.is_symlink()]


@pytest.mark.parametrize("case", ["symlink", "directory"])
def test_metrics_prom_in_the_way_is_refused_before_any_change(tmp_path, case):
    """status/metrics.prom a link, or a directory: refused up front, as every status file is, with nothing created
    (a directory made every apply create its instances, then fail with "unexpected IsADirectoryError")."""
    cfg = copy_quickstart(tmp_path)  # never applied: the apply would create 10 instances
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (cfg / "status").mkdir()
    prom = cfg / "status" / "metrics.prom"
    if case == "symlink":
        prom.symlink_to(victim)
        expect = f"status/metrics.prom is a symlink (to {victim})"
    else:
        prom.mkdir()
        expect = "status/metrics.prom is not a regular file"
    assert_clean_error(cli_here("apply", cfg, "--auto-approve"), expect, "Remove or move it away")
    assert _live(cfg) == [] and victim.read_text() == "precious\n"
    assert sorted(p.name for p in (cfg / "status").iterdir()) == ["metrics.prom"]  # no temp file left behind
    prom.unlink() if case == "symlink" else prom.rmdir()
    (cfg / "status" / ".fleet.yaml.tmp").mkdir()  # a directory where a temp file goes: refused up front too
    assert_clean_error(cli_here("apply", cfg, "--auto-approve"), "status/.fleet.yaml.tmp is in the way")
    assert _live(cfg) == []


@pytest.mark.parametrize("command", ["plan", "report"])
def test_out_never_writes_through_a_link_at_its_name(tmp_path, command):
    """s35: `plan --out plan.json` (the gitops plan workflow's) and `report --out` wrote with a plain write, through a
    link at that name: a pull request that commits `plan.json -> /home/runner/.profile` had CI overwrite that file.
    --out now replaces the link with the file, as `metrics --out` and status/ do; /dev/stdout is still written."""
    cfg = copy_quickstart(tmp_path)
    outside = tmp_path / "outside.txt"
    outside.write_text("someone's file\n")
    out = cfg / ("plan.json" if command == "plan" else "report.html")
    out.symlink_to(outside)
    args = (command, cfg, "--out", out, "--time-limit", "0")
    res = cli_here(*args)
    if command == "report" and "needs plotly" in res.stderr:
        pytest.skip("reconcile report needs plotly")
    assert res.returncode == 0, res.stderr
    assert outside.read_text() == "someone's file\n"
    assert not out.is_symlink() and out.stat().st_size > 0
    if command == "plan":
        assert json.loads(out.read_text())["format"] == 2
        res = cli("plan", cfg, "--out", "/dev/stdout", "--time-limit", "0", "--format", "json")
        assert res.returncode == 0 and res.stdout.count('"body_digest"') == 2, res.stderr  # (the printed plan, then --out's)


def test_metrics_out_is_written_atomically_and_refuses_a_directory(applied, tmp_path):
    """`reconcile metrics --out`: a directory is a clear error (was "unexpected IsADirectoryError"); the temporary
    file next to the output has an unpredictable name, so a link planted there is not written through."""
    out_dir = tmp_path / "textfile"
    out_dir.mkdir()
    assert_clean_error(cli_here("metrics", applied, "--out", out_dir), f"{out_dir} is a directory")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    res = subprocess.run(["sh", "-c", 'ln -s "$1" "$2/.fleet.prom.$$.tmp" && exec "$3" -m reconciler.cli metrics "$4" --out "$2/fleet.prom"',
                          "sh", str(victim), str(out_dir), sys.executable, str(applied)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert victim.read_text() == "precious\n" and (out_dir / "fleet.prom").read_text().startswith("# HELP fleetops_")
    assert sorted(p.name for p in out_dir.iterdir() if not p.is_symlink()) == ["fleet.prom"]


@pytest.mark.parametrize("where", ["assignments", "cache", "cache/parse"])
def test_nothing_is_read_or_written_through_a_symlink_under_dot_reconcile(applied, tmp_path, where):
    """Audit: `.reconcile/assignments` made a link to another directory (a pull request can add one to the checkout):
    every apply, even one with no changes, deleted the *.json files there and wrote its own. Now any link under
    .reconcile/ is refused before anything is read or written there, as status/'s are."""
    outside = tmp_path / "outside"
    state = applied / ".reconcile"
    (state / where).rename(outside)
    (state / where).symlink_to(outside)
    (outside / "package.json").write_text('{"name": "my-app"}\n')
    kept = sorted(p.name for p in outside.iterdir())
    before = _live(applied)
    for args in (("plan", applied), ("apply", applied, "--auto-approve"), ("plan", applied, "--no-memo")):
        assert_clean_error(cli_here(*args), f".reconcile/{where} is a symlink (to {outside})", "Remove the link")
    assert sorted(p.name for p in outside.iterdir()) == kept and (outside / "package.json").read_text() == '{"name": "my-app"}\n'
    (state / where).unlink()
    (outside).rename(state / where)
    assert _live(applied) == before


@pytest.mark.parametrize("where", ["plan-memo.json", "desired.pickle", "parse"])
def test_a_cache_file_that_cannot_be_replaced_leaves_no_temporary_file(tmp_path, where):
    """Audit: with .reconcile/cache/plan-memo.json a directory, every plan wrote `.plan-memo.json.<pid>.tmp`, failed to
    rename it over the directory and left it there (so did the load snapshot and the parse cache). The plan still
    succeeds (these are caches), and a failed replace removes its temporary file."""
    cfg = copy_quickstart(tmp_path)
    assert cli_here("plan", cfg).returncode == 0
    cache = cfg / ".reconcile" / "cache"
    blocked = list((cache / "parse").glob("*.json")) if where == "parse" else [cache / where]
    assert blocked
    for path in blocked:
        path.unlink()
        path.mkdir()
    if where == "parse":
        (cache / "desired.pickle").unlink()  # else the load snapshot answers and no file is parsed
    for _ in range(2):
        res = cli_here("plan", cfg)
        assert res.returncode == 0, res.stderr
    assert not [str(p.relative_to(cfg)) for p in (cfg / ".reconcile").rglob("*.tmp")]


@pytest.mark.parametrize("where", ["plan-memo.json", "desired.pickle", "parse"])
def test_a_fifo_at_a_cache_files_name_is_a_miss_not_a_hang(tmp_path, where):
    """Audit: each cache under .reconcile/cache/ was read with read_bytes, so a fifo at an entry's name (a checkout's
    .reconcile/ can come with a pull request) hung every plan for ever. An entry that is no regular file is a miss."""
    cfg = copy_quickstart(tmp_path)
    assert cli_here("plan", cfg, "--time-limit", "0").returncode == 0
    cache = cfg / ".reconcile" / "cache"
    blocked = list((cache / "parse").glob("*.json")) if where == "parse" else [cache / where]
    assert blocked
    for path in blocked:
        path.unlink()
        os.mkfifo(path)
    if where == "parse":
        (cache / "desired.pickle").unlink()  # else the load snapshot answers and no file is parsed
    res = cli("plan", cfg, "--time-limit", "0", timeout=60)
    assert res.returncode == 0, res.stderr


def test_links_the_jobs_make_on_the_simulated_disks_are_theirs(tmp_path):
    """What a job writes on its (simulated) instance's disk is its own: a venv's `bin/python` link in its working
    directory, a `latest` link among its checkpoints. Refused, they would have stopped every plan of the fleet."""
    from reconciler.errors import ReconcileError
    from reconciler.state import refuse_links, state_dir

    sim = state_dir(tmp_path) / "sim"
    (sim / "volumes" / "train" / "ckpt").mkdir(parents=True)
    (sim / "volumes" / "train" / "ckpt" / "latest").symlink_to("step-10")
    (sim / "disks" / "i-1" / "checkpoints" / "train" / "ckpt").mkdir(parents=True)
    (sim / "disks" / "i-1" / "checkpoints" / "train" / "ckpt" / "latest").symlink_to("step-10")
    (sim / "agents" / "i-1" / "replicas" / "train-0" / "venv" / "bin").mkdir(parents=True)
    (sim / "agents" / "i-1" / "replicas" / "train-0" / "venv" / "bin" / "python").symlink_to("/usr/bin/python3")
    refuse_links(tmp_path)
    (sim / "agents" / "i-1" / "agent.log").symlink_to(tmp_path / "elsewhere.log")  # the agent's own files are not
    with pytest.raises(ReconcileError, match="agents/i-1/agent.log is a symlink"):
        refuse_links(tmp_path)


# -- 6. corrupt files: one clear error naming the file, exit 1, nothing launched or deleted ----

@pytest.fixture(scope="module")
def applied_once(tmp_path_factory) -> Path:
    """The quickstart applied once for the module: tests copy it (`applied`), never change it."""
    cfg = copy_quickstart(tmp_path_factory.mktemp("applied"))
    res = cli_here("apply", cfg, "--auto-approve")
    assert res.returncode == 0, res.stderr
    return cfg


def _state(cfg: Path) -> Path:
    return cfg / ".reconcile" / "state.json"


def _journal_with_garbled_middle(cfg: Path) -> None:
    from providers.sim import SimCloud
    from reconciler.state import state_dir

    sim = SimCloud(state_dir(cfg))
    sim.set_fault(latency_ms=0)  # two journal entries after the snapshot
    sim.set_fault(throttle=0)
    lines = sim.journal.read_bytes().splitlines(keepends=True)  # its header, then the entries
    assert len(lines) >= 3
    sim.journal.write_bytes(b"".join([*lines[:2], b'{"instances": {"i-1": \n', *lines[2:]]))


def _edit_state(edit):
    """A corruption that edits the applied state's parsed JSON in place (`edit(state)`)."""
    def corrupt(cfg: Path) -> None:
        raw = json.loads(_state(cfg).read_text())
        edit(raw)
        _state(cfg).write_text(json.dumps(raw))
    return corrupt


def _lock(pid: str):
    """A lock this host's apply could have written, but for its pid (JSON text): held by nobody that can be checked."""
    import socket

    host = json.dumps(socket.gethostname())
    return lambda c: (c / ".reconcile/apply.lock").write_text(
        f'{{"id": "abc123def456", "pid": {pid}, "host": {host}, "since": "2026-01-01T00:00:00+00:00"}}')


def _lost_state_and_fleet_yaml(text: str):
    return lambda c: (_state(c).unlink(), (c / "status/fleet.yaml").write_text(text))


def _status_with(text: str):
    """finetune-a's status file with `text` before what apply wrote."""
    def corrupt(cfg: Path) -> None:
        path = cfg / "status/jobs/finetune-a.yaml"
        path.write_text(text + path.read_text())
    return corrupt


def _fleet_yaml_linked_out(cfg: Path) -> None:
    """The state lost, and status/fleet.yaml a link to a copy of itself outside the config directory."""
    outside = cfg.parent / "outside-fleet.yaml"
    outside.write_bytes((cfg / "status/fleet.yaml").read_bytes())
    _state(cfg).unlink()
    (cfg / "status/fleet.yaml").unlink()
    (cfg / "status/fleet.yaml").symlink_to(outside)


def _edit_sim(edit):
    """A corruption that edits the sim's snapshot (cloud.json: the first instance created) in place (`edit(world)`)."""
    def corrupt(cfg: Path) -> None:
        path = cfg / ".reconcile/sim/cloud.json"
        world = json.loads(path.read_text())
        edit(world)
        path.write_text(json.dumps(world))
    return corrupt


def _edit_sim_journal(edit):
    """A corruption that edits the last entry of the sim's journal (a call that created an instance) in place."""
    def corrupt(cfg: Path) -> None:
        path = cfg / ".reconcile/sim/cloud.journal"
        lines = path.read_text().splitlines()
        entry = json.loads(lines[-1])
        edit(entry)
        path.write_text("\n".join([*lines[:-1], json.dumps(entry)]) + "\n")
    return corrupt


_STATE = "state.json: cannot read the reconciler's state: "
_LOOSE = "anyone who can write there chooses what this apply launches and deletes, so no apply acts on it. Nothing was changed"


def _other_group() -> int:
    """A group of this host that is not the owner's own (root's, as the tests run): group-writable then means others."""
    import grp

    return next(g.gr_gid for g in grp.getgrall() if g.gr_name != "root" and g.gr_gid != os.getgid())


def _group_writable(path: Path) -> None:
    os.chown(path, -1, _other_group())
    path.chmod(path.stat().st_mode | 0o020)
_SIM = "sim/cloud.json: the simulated cloud's record is corrupt: "
_ASSIGNMENT = ".reconcile/assignments/sim-aws-00003.json"
_MALFORMED_LOCK = ["apply.lock: nobody: the lock is garbled (its pid", "reconcile unlock garbled-", "or remove the file"]
_FLEET_YAML = "status/fleet.yaml: cannot read the fleet's identity: "


def _odd_lock(what: str, rm: str) -> list[str]:
    return [f".reconcile/apply.lock is not a lock file ({what})", "Nothing was changed", f"`{rm}", "apply.lock`"]


# (name, how to corrupt the applied quickstart, command, what the error must say)
CORRUPT = [
    ("state truncated", lambda c: _state(c).write_text(_state(c).read_text()[:40]), "apply",
     ["state.json: cannot read the reconciler's state: not valid JSON", "move it aside"]),
    ("state garbage", lambda c: _state(c).write_bytes(b"\x00\xff\xfe garbage"), "plan",
     ["state.json: cannot read the reconciler's state: not valid JSON"]),
    ("state empty", lambda c: _state(c).write_text(""), "apply", ["state.json: cannot read the reconciler's state: not valid JSON (empty)"]),
    ("state a list", lambda c: _state(c).write_text("[]"), "apply", ["state.json: cannot read the reconciler's state: expected a JSON object, got list"]),
    ("state wrong types", lambda c: _state(c).write_text('{"placements": {"train": "i-1"}}'), "apply",
     ["state.json: cannot read the reconciler's state: placements is not a map of job -> [instance id]"]),
    ("state negative serial", lambda c: _state(c).write_text('{"serial": -5}'), "plan",
     ["state.json: cannot read the reconciler's state: serial is negative (-5)", "move it aside"]),
    # A serial goes into every instance's placement tags (AWS: 256 characters, GCP labels: 63): a 401-digit one was
    # accepted and written there.
    ("state serial huge", _edit_state(lambda s: s.update(serial=10**400)), "apply",
     [_STATE + "serial is out of range (401 digits; an apply's serial is below 2**63)", "move it aside"]),
    ("state bad since", lambda c: _state(c).write_text('{"since": {"train": "yesterday"}}'), "plan",
     ["state.json: cannot read the reconciler's state: since is not a map of job -> serial"]),
    ("state bad aged", lambda c: _state(c).write_text('{"aged": {"train": "high"}}'), "plan",
     ["state.json: cannot read the reconciler's state: aged is not a map of job -> priority (a positive integer)"]),
    ("state bad time", lambda c: _state(c).write_text('{"short": [{"cloud": "aws", "zone": "z", "instance_type": "t", "market": "spot", "until": "soon"}]}'),
     "apply", ["state.json: cannot read the reconciler's state: short: until 'soon' is not a time"]),
    # A state this fleetops cannot read whole: refused, with "upgrade", never "move it aside" (its next save would drop
    # what it does not know; `{"version": 99}` was planned from as an empty state)
    ("state from a newer fleetops", _edit_state(lambda s: s.update(format=2)), "plan",
     [_STATE + "it was written by a newer fleetops (state format 2; this one reads format 1)", "Upgrade fleetops"]),
    ("state unknown field", lambda c: _state(c).write_text('{"version": 99}'), "apply",
     [_STATE + "unknown field 'version' (state format 1 has none such", "Upgrade fleetops"]),
    ("state format garbled", _edit_state(lambda s: s.update(format="one")), "plan", [_STATE + 'format is "one", not a format number']),
    # Every field's shape (audit: each of these was an "unexpected AttributeError/KeyError/TypeError", accepted
    # silently, or, for GPU indices, planned as "No changes" and then failed or written into the cloud's tags).
    ("state fleet a string", _edit_state(lambda s: s.update(fleet="quickstart")), "plan", [_STATE + "fleet is not {name, uid}", "move it aside"]),
    ("state fleet wrong types", _edit_state(lambda s: s.update(fleet={"name": 5, "uid": []})), "apply", [_STATE + "fleet is not {name, uid}"]),
    ("state regions a number", _edit_state(lambda s: s.update(regions=5)), "plan", [_STATE + "regions is not a list"]),
    ("state region a list", _edit_state(lambda s: s.update(regions=[["x"]])), "apply", [_STATE + "regions[0] is not an object"]),
    ("state region without cloud", _edit_state(lambda s: s["regions"].append({"provider": "sim"})), "apply",
     [_STATE + "regions[3].cloud is missing"]),
    ("state region unknown provider", _edit_state(lambda s: s["regions"].append({"provider": "bogus", "cloud": "aws", "region": "x"})),
     "apply", [_STATE + "regions[3] records instances launched through provider 'bogus' in aws/x, which is not installed", "move it aside"]),
    ("state shapes a string", _edit_state(lambda s: s.update(shapes="x")), "plan", [_STATE + "shapes is not a map of job ->"]),
    ("state shape wrong type", _edit_state(lambda s: s["shapes"].update({"finetune-a": {"gpus": "lots"}})), "apply",
     [_STATE + 'shapes.finetune-a.gpus is "lots", not a non-negative integer']),
    ("state shape bad mig", _edit_state(lambda s: s["shapes"]["finetune-a"].update(mig="half")), "plan",
     [_STATE + 'shapes.finetune-a.mig is "half"']),
    ("state gpus booleans", _edit_state(lambda s: s["gpus"].update({"finetune-a": [[True]]})), "apply",
     [_STATE + "gpus.finetune-a is not a list of [GPU index] per replica"]),
    ("state gpus negative", _edit_state(lambda s: s["gpus"].update({"finetune-a": [[-1]]})), "plan",
     [_STATE + "gpus.finetune-a: replica 0 holds GPU index -1, which is negative"]),
    ("state gpus twice", _edit_state(lambda s: s["gpus"].update({"llm-pretrain": [[0, 1, 2, 3, 4, 5, 6, 7], [0, 0, 1, 2, 3, 4, 5, 6]]})),
     "apply", [_STATE + "gpus.llm-pretrain: replica 1 holds GPU 0 twice"]),
    ("state a directory", lambda c: (_state(c).unlink(), _state(c).mkdir()), "apply", ["state.json: cannot read the reconciler's state: Is a directory"]),
    # A key twice: JSON's last one won, silently, while a person reading the file sees the first (s35).
    ("state a key twice", lambda c: _state(c).write_text('{"serial": 0, ' + _state(c).read_text()[1:]), "plan",
     [_STATE + 'not valid JSON (the key "serial" appears twice in one object', "move it aside"]),
    ("sim snapshot a key twice", lambda c: (c / ".reconcile/sim/cloud.json").write_text(
        '{"next_id": 1, ' + (c / ".reconcile/sim/cloud.json").read_text()[1:]), "plan",
     [_SIM + 'not valid JSON (the key "next_id" appears twice in one object']),
    ("assignment a key twice", lambda c: (c / _ASSIGNMENT).write_text('{"serial": 0, ' + (c / _ASSIGNMENT).read_text()[1:]),
     "apply", ['bus object assignments/sim-aws-00003.json is not valid JSON (the key "serial" appears twice']),
    # The state was read up to 1 GiB (parsed: ~10 GiB of memory); a 50k-job fleet's is 9.5 MiB (s35).
    ("state past the cap", lambda c: os.truncate(_state(c), (256 << 20) + 1), "plan", [_STATE + "it is larger than 256 MiB"]),
    # Any object of the local bus was read whole: a 3 GiB started.json was an "unexpected MemoryError" (s35).
    ("started.json past the cap", lambda c: os.truncate(c / ".reconcile/started.json", (256 << 20) + 1), "plan",
     ["bus object started.json is larger than 256 MiB"]),
    # Writable by others than its owner: any user of the host chose what an apply deleted and placed (s35). Plan and
    # status only read it, and go on.
    ("state world-writable", lambda c: _state(c).chmod(0o666), "apply",
     ["state.json is writable by anyone (`chmod o-w {cfg}/.reconcile/state.json`)", _LOOSE]),
    (".reconcile world-writable", lambda c: (c / ".reconcile").chmod(0o777), "apply",
     ["/.reconcile is writable by anyone (`chmod o-w ", _LOOSE]),
    (".reconcile writable by another group", lambda c: _group_writable(c / ".reconcile"), "apply",
     ["/.reconcile is writable by the group ", "(`chmod g-w ", _LOOSE]),
    ("the config dir world-writable", lambda c: c.chmod(0o777), "apply",
     ["/cfg is writable by anyone (`chmod o-w ", _LOOSE]),
    # JSON nested deeper than the decoder recurses, and a \ud800 escape (half a UTF-16 pair, no text): each was an
    # "unexpected RecursionError / UnicodeEncodeError", a bug paragraph naming no file, from the state, the sim's snapshot
    # and journal, the lock and a pinned catalog (attacks s34).
    ("state nested too deep", lambda c: _state(c).write_text("[" * 100_000), "plan",
     [_STATE + "not valid JSON (nested too deep to be read)", "move it aside"]),
    ("state a lone surrogate", lambda c: _state(c).write_text(_state(c).read_text().replace('"finetune-a"', '"finetune-\\ud800"', 1)),
     "plan", [_STATE + "not valid JSON (a string holds \\ud800, half of a UTF-16 surrogate pair)", "move it aside"]),
    ("sim snapshot nested too deep", lambda c: (c / ".reconcile/sim/cloud.json").write_text("[" * 100_000), "plan",
     [_SIM + "not valid JSON (nested too deep to be read)", "delete"]),
    ("sim journal entry nested too deep", lambda c: (c / ".reconcile/sim/cloud.journal").open("a").write("[" * 100_000 + "\n"), "plan",
     ["sim/cloud.journal: the simulated cloud's record is corrupt: entry", "nested too deep to be read"]),
    ("lock nested too deep", lambda c: (c / ".reconcile/apply.lock").write_text("[" * 100_000), "apply",
     ["the lock is garbled (not a lock this tool wrote)", "reconcile unlock garbled-"]),
    # A file where the reconciler's directories belong: `.reconcile` was an "unexpected FileExistsError" from apply's lock;
    # `.reconcile/assignments` was listed as no assignments, and apply created an instance before it failed to write its
    # assignment there (attacks s34).
    (".reconcile (state and sim) a file", lambda c: (shutil.rmtree(c / ".reconcile"), (c / ".reconcile").write_text("x")), "apply",
     [".reconcile is not a directory", "Nothing was changed"]),
    ("assignments a file", lambda c: (shutil.rmtree(c / ".reconcile/assignments"), (c / ".reconcile/assignments").write_text("x")),
     "apply", [".reconcile/assignments is not a directory", "Nothing was changed"]),
    ("pinned catalog nested too deep", lambda c: (c / "catalog.json").write_text("[" * 100_000), "plan",
     ["catalog.json: cannot read the pinned price catalog: not valid JSON (nested too deep to be read)"]),
    # A fifo at its name hung plan and apply for ever (it was read as a file); a time without a zone was an "unexpected
    # TypeError" (compared with the clock's aware time), a bug paragraph naming no file (audit).
    ("state a fifo", lambda c: (_state(c).unlink(), os.mkfifo(_state(c))), "plan",
     [_STATE + "not a regular file (a fifo, socket or device)", "move it aside"]),
    ("state time without a zone", lambda c: _state(c).write_text(
        '{"short": [{"cloud": "aws", "zone": "z", "instance_type": "t", "market": "spot", "until": "2099-01-01T00:00:00"}]}'),
     "plan", [_STATE + "short: until '2099-01-01T00:00:00' is not a time with a zone"]),
    ("sim snapshot truncated", lambda c: (c / ".reconcile/sim/cloud.json").write_text((c / ".reconcile/sim/cloud.json").read_text()[:100]), "apply",
     ["sim/cloud.json: the simulated cloud's record is corrupt: not valid JSON", "delete"]),
    ("sim snapshot a fifo", lambda c: ((c / ".reconcile/sim/cloud.json").unlink(), os.mkfifo(c / ".reconcile/sim/cloud.json")),
     "plan", ["sim/cloud.json: cannot read the simulated cloud's record: not a regular file (a fifo, socket or device)"]),
    ("sim snapshot wrong type", lambda c: (c / ".reconcile/sim/cloud.json").write_text('{"instances": [], "keys": {}, "next_id": 1, "faults": {}}'),
     "plan", ["sim/cloud.json: the simulated cloud's record is corrupt: it is not a snapshot"]),
    ("sim journal garbled", _journal_with_garbled_middle, "apply", ["sim/cloud.journal: the simulated cloud's record is corrupt: entry 2"]),
    # Each instance and key the sim reads back (audit: each was an "unexpected KeyError/TypeError/AttributeError", a bug
    # paragraph naming no file).
    ("sim instance without its cloud", _edit_sim(lambda w: w["instances"]["sim-aws-00001"].pop("cloud")), "plan",
     [_SIM + "instances.sim-aws-00001.cloud is missing", "delete"]),
    ("sim instance zone a number", _edit_sim(lambda w: w["instances"]["sim-aws-00001"].update(zone=5)), "plan",
     [_SIM + "instances.sim-aws-00001.zone is 5, not a string"]),
    ("sim journal tag a number", _edit_sim_journal(lambda e: next(iter(e["instances"].values()))["tags"].update(x=5)), "plan",
     ["sim/cloud.journal: the simulated cloud's record is corrupt: entry", "tags is not a map of strings"]),
    ("sim journal instance a string", _edit_sim_journal(lambda e: e["instances"].update({"sim-aws-00002": "x"})), "plan",
     ["sim/cloud.journal: the simulated cloud's record is corrupt: entry", "instances.sim-aws-00002 is not an object"]),
    ("sim journal key of no instance", _edit_sim_journal(lambda e: e["keys"].update({"k-1": "sim-nope"})), "plan",
     ["sim/cloud.journal: the simulated cloud's record is corrupt: entry", 'keys.k-1 names "sim-nope", which it has no record of']),
    ("sim journal call count a string", _edit_sim_journal(lambda e: e["top"].update(calls="x")), "apply",
     ["sim/cloud.journal: the simulated cloud's record is corrupt: entry", 'calls is "x", not a count']),
    ("status/fleet.yaml a directory", lambda c: ((c / "status/fleet.yaml").unlink(), (c / "status/fleet.yaml").mkdir()), "apply",
     ["status/fleet.yaml is not a regular file", "Remove or move it away"]),
    ("status/jobs a file", lambda c: (shutil.rmtree(c / "status/jobs"), (c / "status/jobs").write_text("x")), "apply",
     ["status/jobs is not a directory"]),
    ("status file garbled", lambda c: next((c / "status/jobs").glob("*.yaml")).write_text("status: [unclosed\n"), "status",
     ["cannot read this status file: not valid YAML (line 2)", "run apply again"]),
    ("status file wrong shape", lambda c: (c / "status/fleet.yaml").write_text("status: {instances: many}\n"), "status",
     ["fleet.yaml: cannot read this status file: metadata.name is missing"]),
    # Its agents (what is wrong with them, as of the last apply) are shown as they are read: a fault not a reason and a
    # message would be a traceback in `reconcile status` once no bus could be read.
    ("status/fleet.yaml agents garbled", lambda c: (c / "status/fleet.yaml").write_text(
        (c / "status/fleet.yaml").read_text().replace("\nstatus:\n", "\nstatus:\n  agents: {i-1: broken}\n", 1)), "status",
     ["fleet.yaml: cannot read this status file: status.agents is not a mapping of instances to a reason and a message"]),
    # A YAML alias (apply writes none; a pull request can commit status/): nine levels of nine made `status --format json`
    # expand 43M values until killed, and one that names itself was an "unexpected ValueError: Circular reference" (audit).
    ("status file an alias bomb", _status_with("x0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)) + "spec: {extra: *a8}\n"), "status",
     ["finetune-a.yaml: cannot read this status file: it holds a YAML alias", "run apply again"]),
    ("status file an alias of itself", _status_with("spec: {extra: &r [*r]}\n"), "status",
     ["finetune-a.yaml: cannot read this status file: it holds a YAML alias"]),
    # A name apply never gives a status file: one with a newline printed a line of its own in `reconcile status` (audit).
    # A number that is no number (apply writes none): `status` showed "$nan/h", and `status --format json` printed NaN,
    # which is no JSON (attacks s34).
    ("status/fleet.yaml cost .nan", lambda c: (c / "status/fleet.yaml").write_text(
        re.sub(r"hourlyCost: [0-9.]+", "hourlyCost: .nan", (c / "status/fleet.yaml").read_text(), count=1)), "status",
     ["fleet.yaml: cannot read this status file: it holds .nan or .inf", "run apply again"]),
    ("status file an infinite number", _status_with("spec: {extra: [-.inf]}\n"), "status",
     ["finetune-a.yaml: cannot read this status file: it holds .nan or .inf"]),
    ("status file of no job's name", lambda c: shutil.copy(c / "status/jobs/finetune-a.yaml", c / "status/jobs/x\nfleet ok.yaml"),
     "status", ["status/jobs/x\\nfleet ok.yaml: cannot read this status file: its name is no job's (apply writes", "run apply again"]),
    ("status file a string named twice", _status_with("spec: {extra: [&s " + "x" * 1000 + ", *s]}\n"), "status",
     ["finetune-a.yaml: cannot read this status file: it holds a YAML alias"]),
    # No size cap: a status file a pull request commits (or grows by hand) was read whole, however large (audit).
    ("status file past the cap", lambda c: os.truncate(c / "status/jobs/finetune-a.yaml", 65 << 20), "status",
     ["status/jobs/finetune-a.yaml is larger than 64 MiB"]),
    ("lock without fields", lambda c: (c / ".reconcile/apply.lock").write_text("{}"), "apply",
     ["the lock is garbled (not a lock this tool wrote)", "reconcile unlock garbled-"]),
    ("lock empty", lambda c: (c / ".reconcile/apply.lock").write_text(""), "apply", ["the lock is empty", "reconcile unlock garbled-"]),
    ("lock pid a string", _lock('"x"'), "apply", [*_MALFORMED_LOCK, 'pid "x" is not a process id']),
    ("lock pid null", _lock("null"), "apply", _MALFORMED_LOCK),
    ("lock pid huge float", _lock("1e30"), "apply", _MALFORMED_LOCK),
    ("lock pid past a C long", _lock("99999999999999999999"), "apply", _MALFORMED_LOCK),
    # Something other than a file at the lock's name: a directory was an "unexpected IsADirectoryError ... a bug" from
    # apply and unlock, and a fifo hung both (the lock was opened, or read, to learn its holder).
    ("lock a directory", lambda c: (c / ".reconcile/apply.lock").mkdir(), "apply", _odd_lock("a directory", "rm -r")),
    ("lock a directory, unlock", lambda c: (c / ".reconcile/apply.lock").mkdir(), "unlock", _odd_lock("a directory", "rm -r")),
    ("lock a fifo", lambda c: os.mkfifo(c / ".reconcile/apply.lock"), "apply", _odd_lock("a special file", "rm ")),
    ("lock a fifo, unlock", lambda c: os.mkfifo(c / ".reconcile/apply.lock"), "unlock", _odd_lock("a special file", "rm ")),
    # status/fleet.yaml says who the fleet is when the state is lost: malformed, it was taken as no identity, and the
    # fleet's own instances were "another fleet of that name" (rename a Topology, or --adopt-fleet).
    ("status/fleet.yaml uid a number, state lost", _lost_state_and_fleet_yaml("metadata: {name: quickstart, uid: 5}\n"), "apply",
     [_FLEET_YAML + "metadata.uid is 5, not a string", "Restore it from git"]),
    ("status/fleet.yaml uid a list, state lost", _lost_state_and_fleet_yaml("metadata: {name: quickstart, uid: [a]}\n"), "plan",
     [_FLEET_YAML + "metadata.uid is ['a'], not a string"]),
    ("status/fleet.yaml a list, state lost", _lost_state_and_fleet_yaml("[1]\n"), "apply",
     [_FLEET_YAML + "it is not a status document (a YAML list, not a mapping)"]),
    # ... and it is read as status/ is, never through a link nor from a fifo: a fifo hung plan for ever, and a link to
    # /dev/zero (a pull request can commit one) read until the machine ran out of memory (audit).
    ("status/fleet.yaml a fifo, state lost", lambda c: (_state(c).unlink(), (c / "status/fleet.yaml").unlink(),
                                                        os.mkfifo(c / "status/fleet.yaml")), "plan",
     ["status/fleet.yaml is not a regular file", "Remove or move it away"]),
    ("status/fleet.yaml a link out, state lost", _fleet_yaml_linked_out, "plan",
     ["status/fleet.yaml is a symlink (to ", "Remove or move it away"]),
    ("assignment wrong type", lambda c: _edit_assignment(c, published_at="x"), "apply",
     ["bus object assignments/sim-aws-00003.json has published_at \"x\", not a unix time", "delete it and its writer rewrites it"]),
    ("assignment garbled", lambda c: (c / ".reconcile/assignments/sim-aws-00003.json").write_text("{"), "apply",
     ["bus object assignments/sim-aws-00003.json is not valid JSON", "delete it and its writer rewrites it"]),
    # A directory where the object belongs was listed as no object: plan said the job "starts", apply created its
    # instances and then failed writing the assignment (audit).
    ("assignment a directory", lambda c: ((c / _ASSIGNMENT).unlink(), (c / _ASSIGNMENT).mkdir()), "apply",
     ["bus object assignments/sim-aws-00003.json is not a file (a directory)", "delete it"]),
]


def _edit_assignment(cfg: Path, **fields) -> None:
    import json

    path = cfg / ".reconcile/assignments/sim-aws-00003.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


@pytest.mark.parametrize("name,corrupt,command,needles", CORRUPT, ids=[c[0] for c in CORRUPT])
def test_corrupt_files_are_one_clear_error(applied_once, tmp_path, name, corrupt, command, needles):
    cfg = tmp_path / "cfg"
    shutil.copytree(applied_once, cfg)
    (cfg / "jobs" / "platform.yaml").write_text((cfg / "jobs" / "platform.yaml").read_text().replace("cpu: 14", "cpu: 13"))
    before = _live(cfg)
    corrupt(cfg)
    args = {"apply": ("apply", cfg, "--auto-approve"), "plan": ("plan", cfg), "status": ("status", cfg),
            "unlock": ("unlock", "garbled-00000000", "--dir", cfg)}[command]
    if name.startswith("sim journal"):
        # A process keeps the sim's world read so far (providers/sim.py _CACHE, filled by `_live` above) and reads a
        # journal on from there; a fresh `reconcile` reads it all, from the snapshot on: so does this one, forgetting it.
        from providers import sim

        sim._CACHE.clear()
    assert_clean_error(cli_here(*args), *(n.replace("{cfg}", str(cfg)) for n in needles))
    if "sim" not in name:
        assert _live(cfg) == before  # nothing launched or deleted on the strength of it


@pytest.mark.parametrize("case", ["fifo", "/dev/zero", "past the cap", "world-writable", "writable by another group"])
def test_a_saved_plan_is_read_only_from_a_file_its_owner_alone_writes(applied_once, tmp_path, case):
    """s35: `apply --plan FIFO` waited for a writer for ever, `--plan /dev/zero` was read until memory ran out, a plan
    file of any size was read whole, and one that any user of the host could rewrite was applied: the plan is what
    apply does. Each is refused naming the file, before anything is done."""
    cfg = tmp_path / "cfg"
    shutil.copytree(applied_once, cfg)
    (cfg / "jobs" / "platform.yaml").write_text((cfg / "jobs" / "platform.yaml").read_text().replace("cpu: 14", "cpu: 13"))
    plan = tmp_path / "plan.json"
    assert cli_here("plan", cfg, "--out", plan, "--time-limit", "1").returncode == 0
    before = _live(cfg)
    says = {"fifo": "not a regular file (a fifo, socket or device)", "/dev/zero": "not a regular file (a fifo, socket or device)",
            "past the cap": "it is larger than 256 MiB, which no plan is",
            "world-writable": f"{plan} is writable by anyone (`chmod o-w {plan}`)",
            "writable by another group": f"{plan} is writable by the group "}[case]
    if case == "fifo":
        plan.unlink()
        os.mkfifo(plan)
    elif case == "/dev/zero":
        plan.unlink()
        plan.symlink_to("/dev/zero")
    elif case == "past the cap":
        os.truncate(plan, (256 << 20) + 1)
    elif case == "world-writable":
        plan.chmod(0o666)
    else:
        _group_writable(plan)
    args = ("apply", cfg, "--plan", plan)
    # (a process where the read could hang, or eat the machine's memory: the fix's absence fails, it does not hang)
    res = cli(*args, timeout=30, memory=2 << 30) if case in ("fifo", "/dev/zero") else cli_here(*args)
    assert_clean_error(res, f"cannot read plan {plan}: {says}")
    assert _live(cfg) == before


def test_a_garbled_lock_past_what_is_read_of_it_is_broken_by_the_id_apply_names(applied_once, tmp_path):
    """s35: apply read the first 64 KiB of a lock to name a garbled one's id, unlock read all of it: for a lock larger
    than that, the id apply named was never the one unlock found, and the lock could not be broken but by hand."""
    cfg = tmp_path / "cfg"
    shutil.copytree(applied_once, cfg)
    (cfg / ".reconcile/apply.lock").write_bytes(b"x" * 100_000)
    res = cli_here("apply", cfg, "--auto-approve")
    assert_clean_error(res, "the lock is garbled", "reconcile unlock garbled-")
    lock_id = res.stderr.split("reconcile unlock ")[1].split()[0].rstrip("`")
    res = cli_here("unlock", lock_id, "--dir", cfg)
    assert res.returncode == 0, res.stderr
    assert not (cfg / ".reconcile/apply.lock").exists()


@pytest.mark.parametrize("args", [("plan", "{cfg}", "--state", ""), ("apply", "{cfg}", "--auto-approve", "--state", " "),
                                  ("status", "{cfg}", "--state", "")])
def test_an_empty_state_option_is_a_usage_error_not_the_local_state(applied_once, tmp_path, args):
    """s35: `--state ""` (`--state "$STATE"` with STATE unset) meant the local state: an apply meant for a bucket's fleet
    acted on whatever .reconcile/ the runner had (a fresh CI checkout: none, so the whole fleet again)."""
    cfg = tmp_path / "cfg"
    shutil.copytree(applied_once, cfg)
    before = _live(cfg)
    res = cli_here(*(a.replace("{cfg}", str(cfg)) for a in args))
    assert_clean_error(res, "Invalid value for '--state'", "is empty")
    assert _live(cfg) == before


def test_plan_and_status_read_a_state_others_may_write(applied_once, tmp_path):
    """Only acting on it is refused: plan shows what an apply would do and status what is, from the same state."""
    cfg = tmp_path / "cfg"
    shutil.copytree(applied_once, cfg)
    _state(cfg).chmod(0o666)
    for args in (("plan", cfg, "--time-limit", "1"), ("status", cfg)):
        res = cli_here(*args)
        assert res.returncode == 0, res.stderr


def test_state_serial_is_a_64_bit_counter():
    from reconciler.state import StateFileError, state_from_json

    assert state_from_json(json.dumps({"serial": 2**63 - 1})).serial == 2**63 - 1
    with pytest.raises(StateFileError, match=r"serial is out of range \(19 digits"):
        state_from_json(json.dumps({"serial": 2**63}))


@pytest.mark.parametrize("where", ["state", "tags"])
def test_gpu_indices_past_the_instance_never_reach_the_cloud(applied_once, tmp_path, where):
    """Audit: finetune-a recorded on GPU 99 of its 1-GPU a2-highgpu-1g (the state edited, or tags a corrupt state's apply
    wrote) planned as "No changes", and apply wrote `finetune-a/0@99` into the instance's placement tags and GPU "99"
    into its agent assignment. Such indices are not trusted: dropped with a note, the replica is given GPU 0 again.
    (The state edited at its own serial: the instance's tags of that apply, GPU 0, win, said in a note.)"""
    from providers.placements import TAG_PLACEMENTS, TAG_PLACEMENTS_SERIAL
    from providers.sim import SimCloud
    from reconciler.state import state_dir

    cfg = tmp_path / "cfg"
    shutil.copytree(applied_once, cfg)
    host = json.loads(_state(cfg).read_text())["placements"]["finetune-a"][0]
    if where == "state":
        _edit_state(lambda s: s["gpus"].update({"finetune-a": [[99]]}))(cfg)
    else:  # tags newer than the state, of an apply that began at 50 and died: they say what the instance hosts
        with SimCloud(state_dir(cfg)).world() as w:
            w["instances"][host]["tags"].update({TAG_PLACEMENTS: "finetune-a/0@99", TAG_PLACEMENTS_SERIAL: "50"})
        (state_dir(cfg) / "started.json").write_text('{"serial": 50}')
    before = _live(cfg)
    for args in (("plan", cfg), ("apply", cfg, "--auto-approve")):
        res = cli_here(*args)
        assert res.returncode == 0 and "unexpected" not in res.stderr, res.stderr
        out = " ".join((res.stdout + res.stderr).split())
        if where == "state" and args[0] == "plan":
            assert (f"{host}: the state and its tags disagree at serial 1 (one apply writes both, so one was edited since): "
                    "its tags say it hosts finetune-a/0 on GPU(s) [0], the state says finetune-a/0 on GPU(s) [99]; the tags win") in out, out
        elif where == "tags":
            assert (f"job finetune-a: its recorded GPU indices are not trusted (replica 0 on {host} is recorded on GPU(s) [99], "
                    "but its a2-highgpu-1g has 1 GPU(s) (0..0)); the plan gives its replicas GPUs anew") in out, out
    assert _live(cfg) == before
    with SimCloud(state_dir(cfg)).world(write=False) as w:
        assert w["instances"][host]["tags"][TAG_PLACEMENTS] == "finetune-a/0@0"
    assert json.loads(_state(cfg).read_text())["gpus"]["finetune-a"] == [[0]]
    assignment = json.loads((cfg / f".reconcile/assignments/{host}.json").read_text())
    assert [r["gpus"] for r in assignment["replicas"] if r["job"] == "finetune-a"] == [["0"]]
    res = cli_here("plan", cfg, "--detailed-exitcode")
    assert res.returncode == 0 and "not trusted" not in res.stdout + res.stderr, (res.stdout, res.stderr)


def test_one_bad_agent_report_does_not_stop_the_fleet(applied_once, tmp_path):
    """Reports an agent wrote (agents/, runs/) that cannot be read, garbled or mistyped, are skipped and named
    on the plan; the instance is kept (never replaced on an unreadable report). Before: plan and apply
    failed for the whole fleet with `unexpected ValueError` / `unexpected TypeError` (a bug paragraph)."""
    import json

    cfg = tmp_path / "cfg"
    shutil.copytree(applied_once, cfg)
    before = _live(cfg)
    bus = cfg / ".reconcile"
    entry = json.loads((bus / "assignments/sim-aws-00003.json").read_text())["replicas"][0]
    (bus / "agents").mkdir()
    (bus / "agents/sim-aws-00003.json").write_text('{"heartbeat_at": "soon", "state": "Ready"}')
    (bus / "agents/sim-aws-00004.json").write_text('{"heartbeat_at": 1')
    (bus / f"runs/{entry['job']}").mkdir(parents=True)
    (bus / f"runs/{entry['job']}/0.json").write_text(json.dumps({"restarts": "x", "spec_hash": entry["spec_hash"]}))
    for args in (("plan", cfg), ("apply", cfg, "--auto-approve")):
        res = cli_here(*args)
        assert res.returncode == 0 and "unexpected" not in res.stderr, res.stderr
        out = " ".join((res.stdout + res.stderr).split())
        for needle in ('agents/sim-aws-00003.json has heartbeat_at "soon", not a unix time', "agents/sim-aws-00004.json is not valid JSON",
                       f'runs/{entry["job"]}/0.json has restarts "x", not a count'):
            assert needle in out, (needle, out)
    assert _live(cfg) == before


@pytest.mark.parametrize("record", ["garbled", "a directory"])
def test_a_job_whose_run_record_cannot_be_read_is_not_placed_again(applied_once, tmp_path, record):
    """A run record says whether a batch job finished; one that cannot be read was skipped, so the plan placed the job
    again although it may have Succeeded (it would run twice). A job that does not run and whose record cannot be read
    is not placed, and the plan says why; a running one goes on as it runs (above). A directory at the record's name
    was not even listed (audit): the job was placed with no note."""
    cfg = tmp_path / "cfg"
    shutil.copytree(applied_once, cfg)
    (cfg / "jobs" / "done.yaml").write_text("apiVersion: fleetops.io/v1alpha1\nkind: Job\nmetadata: {name: done-batch}\n"
                                            "spec: {tenant: platform, resources: {cpu: 1, memory_gib: 1}, run: {command: [\"true\"]}}\n")
    (cfg / ".reconcile" / "runs" / "done-batch").mkdir(parents=True)
    if record == "garbled":
        (cfg / ".reconcile" / "runs" / "done-batch" / "0.json").write_text('{"phase": "Succ')
    else:
        (cfg / ".reconcile" / "runs" / "done-batch" / "0.json").mkdir()
    res = cli_here("plan", cfg, "--format", "json")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert "done-batch" not in {j["job"] for j in plan["jobs"] if j["instances"]}
    assert any("job done-batch is not placed while its run record cannot be read" in n for n in plan["notes"]), plan["notes"]



@pytest.mark.parametrize("where", ["runs/done-batch", "runs"])
def test_a_bus_directory_that_cannot_be_listed_is_an_error_not_no_records(applied_once, tmp_path, monkeypatch, where):
    """A run record says a batch job Succeeded. The local bus listed its directories with Path.rglob, which skips one it
    cannot list (permissions: an agent writing with another user's umask): the record was not there, so the plan placed
    the finished job again and apply ran it a second time, exit 0 (audit, on the sim as a user without read access to
    .reconcile/runs/<job>). Now the listing fails naming the directory, and nothing is planned from the rest. os.scandir
    is made to fail there, as it does for a user who may not read it (root reads every directory)."""
    from reconciler import api
    from reconciler.errors import ReconcileError

    cfg = tmp_path / "cfg"
    shutil.copytree(applied_once, cfg)
    (cfg / "jobs" / "done.yaml").write_text("apiVersion: fleetops.io/v1alpha1\nkind: Job\nmetadata: {name: done-batch}\n"
                                            "spec: {tenant: platform, resources: {cpu: 1, memory_gib: 1}, run: {command: [\"true\"]}}\n")
    from reconciler.model import Job
    from reconciler.runtime.assign import spec_hash

    job = Job.model_validate({"apiVersion": "fleetops.io/v1alpha1", "kind": "Job", "metadata": {"name": "done-batch"},
                              "spec": {"tenant": "platform", "resources": {"cpu": 1, "memory_gib": 1}, "run": {"command": ["true"]}}})
    (cfg / ".reconcile" / "runs" / "done-batch").mkdir(parents=True)
    (cfg / ".reconcile" / "runs" / "done-batch" / "0.json").write_text(json.dumps({
        "job": "done-batch", "replica": 0, "instance": "sim-aws-00003", "phase": "Succeeded", "reason": "Completed",
        "terminal": True, "spec_hash": spec_hash(job), "exit_code": 0, "restarts": 0, "attempt": 0}))
    placed = {j.job for j in api.plan(cfg, time_limit=5).plan.jobs if j.instances}
    assert "done-batch" not in placed  # finished: it demands nothing

    shut = (cfg / ".reconcile" / where).resolve()
    scandir = os.scandir

    def refusing(path="."):
        if not isinstance(path, int) and Path(path).resolve() == shut:
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)
    with pytest.raises(ReconcileError, match=f"local bus: cannot list .*{where}: Permission denied"):
        api.plan(cfg, time_limit=5)


def test_logs_prints_no_file_but_the_sims_own_log_of_the_replica(tmp_path):
    """A run record is an agent's (on a shared bus any instance's agent may write runs/*), and `logs` printed whatever
    local file its log_path named: a planted credentials file, or the cache seal's key (audit). It prints a file only
    where the sim's agent of the record's instance writes that replica's log, else the tail the agent reported."""
    cfg = copy_quickstart(tmp_path)
    secret = tmp_path / "credentials"
    secret.write_text("aws_secret_access_key = planted-secret\n")
    run = cfg / ".reconcile/runs/finetune-a/0.json"
    run.parent.mkdir(parents=True)
    rec = {"job": "finetune-a", "replica": 0, "instance": "sim-gcp-00007", "phase": "Running", "log_tail": ["step 1 of 150"]}
    outside = tmp_path / "outside/logs/finetune-a-0.log"  # (the instance `../../../../outside` from the agents' directory)
    outside.parent.mkdir(parents=True)
    outside.write_text("planted-secret\n")
    for bad in ({"log_path": str(secret)}, {"instance": "../../../../outside", "log_path": str(outside)}):
        run.write_text(json.dumps({**rec, **bad}))
        res = cli_here("logs", cfg, "finetune-a")
        assert res.returncode == 0 and res.stdout == "step 1 of 150\n", (bad, res.stdout, res.stderr)
    own = cfg / ".reconcile/sim/agents/sim-gcp-00007/logs/finetune-a-0.log"
    own.parent.mkdir(parents=True)
    own.write_text("step 1 of 150\nstep 2 of 150\n")
    run.write_text(json.dumps({**rec, "log_path": str(own.resolve())}))
    res = cli_here("logs", cfg, "finetune-a")
    assert res.returncode == 0 and res.stdout == "step 1 of 150\nstep 2 of 150\n", res.stderr

    # Moved here from another instance (a spot reclaim): what it printed there comes first, as part of its whole log.
    before = cfg / ".reconcile/sim/agents/sim-gcp-00003/logs/finetune-a-0.log"
    before.parent.mkdir(parents=True)
    before.write_text("step 90 of 150\ncheckpoint saved at step 90\n")
    os.utime(before, (own.stat().st_mtime - 60,) * 2)
    res = cli_here("logs", cfg, "finetune-a")
    assert res.returncode == 0 and res.stdout == "step 90 of 150\ncheckpoint saved at step 90\nstep 1 of 150\nstep 2 of 150\n", res
    assert "finetune-a/0 on sim-gcp-00003 (placed there before)" in res.stderr, res.stderr


@pytest.fixture
def s3_state(aws_env, request):
    """A bucket on the moto server, and the environment the CLI needs to use it as its state backend."""
    import boto3

    from tests.conftest import AWS_ENV

    env = {**AWS_ENV, "AWS_ENDPOINT_URL_S3": aws_env}
    s3 = boto3.client("s3", endpoint_url=aws_env)
    bucket = f"safety-{abs(hash(request.node.name)) % 10**8}"
    s3.create_bucket(Bucket=bucket)
    return env, f"s3://{bucket}/fleet", s3, bucket


def test_garbled_s3_state_and_lock_objects(s3_state, applied_once, tmp_path):
    env, url, s3, bucket = s3_state
    cfg = tmp_path / "cfg"
    shutil.copytree(applied_once, cfg)
    before = _live(cfg)
    s3.put_object(Bucket=bucket, Key="fleet/state.json", Body=b'{"placements": [1, 2')
    assert_clean_error(cli_here("apply", cfg, "--auto-approve", "--state", url, env=env),
                       f"{url}/state.json: cannot read the reconciler's state: not valid JSON", "move it aside")
    s3.delete_object(Bucket=bucket, Key="fleet/state.json")

    s3.put_object(Bucket=bucket, Key="fleet/lock.json", Body=b"\x00not json")
    res = cli_here("apply", cfg, "--auto-approve", "--state", url, env=env)
    assert_clean_error(res, f"another apply holds the lock {url}/lock.json: nobody: the lock is garbled", "reconcile unlock garbled-")
    lock_id = res.stderr.split("reconcile unlock ")[1].split()[0].rstrip("`")
    assert_clean_error(cli_here("unlock", "garbled-00000000", "--state", url, env=env), f"held by {lock_id}, not garbled-00000000")
    res = cli_here("unlock", lock_id, "--state", url, env=env)
    assert res.returncode == 0, res.stderr
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix="fleet/lock.json")

    # An expiry without a zone (another tool's, a hand edit) is UTC's: compared with the clock as it was, it was an
    # "unexpected TypeError", a bug paragraph naming no lock and no way out (audit).
    s3.put_object(Bucket=bucket, Key="fleet/lock.json", Body=json.dumps(
        {"id": "abc123def456", "host": "ci-7", "pid": 42, "since": "2026-01-01T00:00:00", "expires": "2999-01-01T00:00:00"}).encode())
    assert_clean_error(cli_here("apply", cfg, "--auto-approve", "--state", url, env=env),
                       f"another apply holds the lock {url}/lock.json: abc123def456", "reconcile unlock abc123def456")
    s3.delete_object(Bucket=bucket, Key="fleet/lock.json")
    assert _live(cfg) == before


def test_refused_s3_endpoint_and_url_credentials_are_redacted(applied_once, tmp_path, aws_env):
    from tests.conftest import AWS_ENV

    cfg = tmp_path / "cfg"
    shutil.copytree(applied_once, cfg)
    before = _live(cfg)
    env = {**AWS_ENV, "AWS_ENDPOINT_URL_S3": "http://fleet:S3CRETPASS@127.0.0.1:9"}  # nothing listens on port 9
    res = cli_here("apply", cfg, "--auto-approve", "--state", "s3://bucket/fleet", env=env)
    assert_clean_error(res, "s3 state backend: cannot lock s3://bucket/fleet/lock.json", "http://***@127.0.0.1:9")
    assert "S3CRETPASS" not in res.stdout + res.stderr and _live(cfg) == before

    # The AWS provider's connection error echoed the endpoint with its password.
    aws = copy_quickstart(tmp_path / "aws").parent / "aws-only"
    shutil.copytree(Path(__file__).resolve().parent.parent / "examples" / "aws-only", aws)
    res = cli_here("plan", aws, "--provider", "aws", "-o", "endpoint_url=http://ops:P4SSW0RD@127.0.0.1:9", env=dict(AWS_ENV))
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert "P4SSW0RD" not in res.stdout + res.stderr and "***@127.0.0.1:9" in res.stderr, res.stderr


# -- 5. locks ------------------------------------------------------------------------------

RACER = """
import json, os, sys, time
from pathlib import Path
from reconciler.errors import LockError
from reconciler.state import ApplyLock
cfg = Path(sys.argv[1])
print("ready", flush=True)  # (imported: the start time comes once every racer is)
start = float(sys.stdin.readline())
while time.time() < start:
    pass
try:
    with ApplyLock(cfg) as held:
        print("won", held.id, flush=True)
        sys.stdin.readline()  # held until every other racer has tried (the test says so; it slept 1.5 s)
except LockError as e:
    print("lost", e, flush=True)
"""


def test_stale_local_lock_is_taken_over_by_exactly_one_of_many_racers(tmp_path):
    import json
    import socket
    import time
    from concurrent.futures import ThreadPoolExecutor

    cfg = tmp_path / "cfg"
    (cfg / ".reconcile").mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for attempt in range(3):  # the race is the kernel's to interleave: give it a few chances to bite
        (cfg / ".reconcile" / "apply.lock").write_text(json.dumps(
            {"id": "deadbeef0000", "pid": dead.pid, "host": socket.gethostname(), "since": "2026-01-01T00:00:00+00:00"}))
        # (a barrier, not a start 2 s ahead: six racers spinning 2 s on two cores starved the other test worker)
        racers = [subprocess.Popen([sys.executable, "-c", RACER, str(cfg)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True) for _ in range(6)]
        assert all(r.stdout.readline() == "ready\n" for r in racers)
        start = time.time() + 0.2
        for r in racers:
            r.stdin.write(f"{start}\n")
            r.stdin.flush()
        with ThreadPoolExecutor(len(racers)) as pool:  # each racer's outcome, the winner's while it still holds
            firsts = [f.result(timeout=120) for f in [pool.submit(r.stdout.readline) for r in racers]]
        for r, first in zip(racers, firsts):
            if first.startswith("won"):
                r.stdin.write("release\n")
                r.stdin.flush()
        outs = [(first + o, e) for first, (o, e) in zip(firsts, (r.communicate(timeout=120) for r in racers))]
        won = [o for o, _ in outs if o.startswith("won")]
        assert len(won) == 1, outs
        assert all(o.startswith(("won", "lost another apply holds the lock")) for o, _ in outs), outs
        assert not (cfg / ".reconcile" / "apply.lock").exists()  # released by the winner
        assert not list((cfg / ".reconcile").glob(".apply.lock.*"))  # no leftovers


def test_garbled_local_lock_is_named_and_unlock_breaks_it(applied):
    (applied / ".reconcile" / "apply.lock").write_text("{not json")
    res = cli_here("apply", applied, "--auto-approve")
    assert_clean_error(res, "nobody: the lock is garbled", "reconcile unlock garbled-")
    lock_id = res.stderr.split("reconcile unlock ")[1].split()[0].rstrip("`")
    res = cli_here("unlock", lock_id, "--dir", applied)
    assert res.returncode == 0, res.stderr
    assert cli_here("apply", applied, "--auto-approve").returncode == 0


def assert_renewed_while_held_and_lost_lease_noticed(holder, other, url: str, read_lock) -> None:
    """One lease test for every remote store (S3 here, GCS and Azure in test_cloud_backends): held past the
    expiry it was first taken with because it is renewed; broken by an operator, its holder notices; the new
    holder's lock outlives the old holder. `read_lock()` returns the lock object's bytes.

    Renewed every 0.25 s (not ttl/3): on a loaded CI machine the heartbeat thread and the store's server can both
    stall for seconds; a 6 s lease renewed 24 times over its life holds through that, a 2-3 s one did not (CI)."""
    import json
    import time
    from datetime import datetime, timedelta, timezone

    from reconciler.errors import LockError

    holder.lease.renew_every = 0.25
    with holder.lock() as lock_id:
        first_expiry = datetime.fromisoformat(json.loads(read_lock())["expires"])
        while datetime.now(timezone.utc) < first_expiry + timedelta(seconds=0.5):
            time.sleep(0.2)  # past the 6 s it was first taken for: renewed, so still held
        with pytest.raises(LockError, match=f"another apply holds the lock {url}/lock.json: {lock_id}"):
            with other.lock():
                pass
        assert datetime.fromisoformat(json.loads(read_lock())["expires"]) > first_expiry  # a later expiry
        holder.check_lock()
        other.unlock(lock_id)  # an operator breaks it (or a runner takes it over): the holder must notice
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                holder.check_lock()
            except LockError as e:
                assert "lost the lock" in str(e) and "broken or taken over" in str(e)
                break
            time.sleep(0.2)
        else:
            pytest.fail("the holder never noticed it lost the lock")
        with other.lock():  # the new holder's lock is not deleted by the old holder leaving
            pass


def test_s3_lock_is_renewed_while_held_and_a_lost_lease_is_noticed(s3_state, monkeypatch):
    from datetime import timedelta

    from reconciler.backend import S3Backend

    env, url, s3, bucket = s3_state
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", env["AWS_ENDPOINT_URL_S3"])
    assert_renewed_while_held_and_lost_lease_noticed(
        S3Backend(url, ttl=timedelta(seconds=6)), S3Backend(url, ttl=timedelta(seconds=6)), url,
        lambda: s3.get_object(Bucket=bucket, Key="fleet/lock.json")["Body"].read())


def test_apply_stops_before_the_next_provider_call_when_its_s3_lock_is_lost(s3_state, monkeypatch, tmp_path):
    import time
    from datetime import timedelta

    from providers.sim import SimCloud
    from reconciler import api, backend
    from reconciler.errors import LockError
    from reconciler.state import state_dir

    env, url, s3, bucket = s3_state
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", env["AWS_ENDPOINT_URL_S3"])
    monkeypatch.setattr(backend, "LOCK_TTL", timedelta(seconds=3))
    cfg = copy_quickstart(tmp_path)
    sim = SimCloud(state_dir(cfg))
    sim.set_fault(latency_ms=1500)  # a slow cloud: the apply outlives its 3 s lease several times
    created = []

    def on_event(e):  # after the 2nd launch, someone else breaks the lock (or takes over an expired one)
        if e.action == "create" and e.phase == "finished":
            created.append(e.target)
            if len(created) == 2:
                s3.delete_object(Bucket=bucket, Key="fleet/lock.json")

    outcome = [_catch(lambda: api.apply(cfg, state=url, time_limit=2, on_event=on_event))]
    assert isinstance(outcome[0], LockError) and "lost the lock" in str(outcome[0]), outcome
    made = _live(cfg)
    assert len(made) < 10  # stopped part-way, not after buying the whole fleet
    with sim.world(write=False) as w:
        calls = w["calls"]
    time.sleep(2)
    with sim.world(write=False) as w:
        assert w["calls"] == calls  # and no call after
    assert _live(cfg) == made


def _catch(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - the test inspects it
        return e


def test_unlock_of_a_lock_renewed_between_read_and_delete_still_breaks_it():
    """The holder renews every ttl/3; an operator's `reconcile unlock ID` that reads the lock just before
    a renewal must not fail with 'changed while it was being broken' (CI saw this race on moto)."""
    from datetime import timedelta

    from reconciler.backend import LeasedLock
    from reconciler.errors import LockError

    class RenewingStore:  # one object with a version counter, renewed by its holder once, right after a read
        lock_url = "mem://fleet/lock.json"

        def __init__(self):
            self.body, self.version, self.renew_after_read = None, 0, False

        def lock_read(self):
            if self.body is None:
                return None
            seen = (self.body, str(self.version))
            if self.renew_after_read:
                self.renew_after_read = False
                self.version += 1  # the holder's heartbeat lands here: same holder, new token
            return seen

        def lock_create(self, body):
            if self.body is not None:
                return None
            self.body, self.version = body, self.version + 1
            return str(self.version)

        def lock_replace(self, body, token):
            if self.body is None or token != str(self.version):
                return None
            self.body, self.version = body, self.version + 1
            return str(self.version)

        def lock_delete(self, token):
            if self.body is None or token != str(self.version):
                return False
            self.body = None
            return True

    store = RenewingStore()
    holder = LeasedLock(store, ttl=timedelta(hours=1), renew_every=3600)
    with holder.hold() as lock_id:
        store.renew_after_read = True
        LeasedLock(store, ttl=timedelta(hours=1)).unlock(lock_id)
        assert store.body is None
        with pytest.raises(LockError, match="no lock is held"):
            LeasedLock(store, ttl=timedelta(hours=1)).unlock(lock_id)
        store.lock_create(b'{"id": "someone-else"}')
        with pytest.raises(LockError, match="held by someone-else, not"):
            LeasedLock(store, ttl=timedelta(hours=1)).unlock(lock_id)
