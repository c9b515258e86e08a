"""Hostile and careless input (issue 15): parser limits, odd files in the config dir, status
written through links, corrupt state files, lock races, secrets in URLs. Every case goes
through the real CLI and must end in a clear error (exit 1), never a traceback or a crash."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fleetkit import copy_quickstart

RECONCILE = [sys.executable, "-m", "reconciler.cli"]


def cli(*args, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """`reconcile ARGS` in its own process: a crash (SIGSEGV) or a traceback shows as what it is."""
    return subprocess.run([*RECONCILE, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


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
    assert_clean_error(cli("validate", cfg), "big.yaml:1: file is larger than 4 MiB")


# -- 2. odd paths in the config dir; status never written through a link -------------------

def _live(cfg: Path) -> list[str]:
    from providers.sim import SimCloud
    from reconciler.state import state_dir

    return sorted(i["id"] for i in SimCloud(state_dir(cfg)).instances() if i["state"] != "terminated")


@pytest.fixture
def applied(tmp_path) -> Path:
    """The quickstart, applied on the sim cloud (10 instances)."""
    cfg = copy_quickstart(tmp_path)
    res = cli("apply", cfg, "--auto-approve")
    assert res.returncode == 0, res.stderr
    return cfg


def test_symlinked_jobs_dir_outside_is_an_error_and_nothing_is_deleted(applied, tmp_path):
    before = _live(applied)
    (applied / "jobs").rename(tmp_path / "shared-jobs")
    (applied / "jobs").symlink_to(tmp_path / "shared-jobs")
    for args in (("plan", applied), ("apply", applied, "--auto-approve")):
        assert_clean_error(cli(*args), "jobs:1: symlink points outside the config directory")
    assert _live(applied) == before  # the jobs did not vanish: their 6 instances still run


def test_symlinked_dir_inside_the_config_dir_is_followed(applied):
    (applied / ".shared").mkdir()
    (applied / "jobs").rename(applied / ".shared" / "jobs")
    (applied / "jobs").symlink_to(Path(".shared") / "jobs")
    (applied / "again").symlink_to(Path("."))  # a link back to the root adds nothing (read once)
    res = cli("plan", applied, "--detailed-exitcode")
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
        assert_clean_error(cli(*args, timeout=60), expect)
    assert _live(applied) == before


def test_status_is_never_written_through_a_symlink(applied, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    job_file = next((applied / "status" / "jobs").glob("*.yaml"))
    job_file.unlink()
    job_file.symlink_to(victim)
    (applied / "jobs" / "platform.yaml").write_text((applied / "jobs" / "platform.yaml").read_text().replace("cpu: 14", "cpu: 13"))
    before = _live(applied)
    res = cli("apply", applied, "--auto-approve")
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
        assert_clean_error(cli(*args), "status is a symlink", "Remove or move it away")
    assert [p.name for p in outside.iterdir()] == ["keep.yaml"] and _live(applied) == before
