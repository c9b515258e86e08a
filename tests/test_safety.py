"""Hostile and careless input (issue 15): parser limits, odd files in the config dir, status
written through links, corrupt state files, lock races, secrets in URLs. Every case goes
through the real CLI and must end in a clear error (exit 1), never a traceback or a crash."""

from __future__ import annotations

import os
import subprocess
import sys


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
