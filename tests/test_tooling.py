"""The developer tooling a fresh clone offers: `task demo` does what its description promises."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _task() -> str:
    exe = shutil.which("task")
    if exe is None:
        pytest.skip("`task` is not installed (the test extra installs go-task-bin)")
    if subprocess.run([exe, "--status", "setup"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip("the venv is older than pyproject.toml: `task demo` would reinstall it first (run `task setup`)")
    return exe


def test_task_demo_interrupts_a_spot_instance_and_heals(tmp_path):
    """The description promises an interruption and a heal: the run shows the interruption, a plan that replaces
    the lost instance (exit 2), an apply, and a plan with nothing left to do (exit 0); setup does not reinstall."""
    exe = _task()
    config = tmp_path / "quickstart"
    shutil.copytree(ROOT / "examples" / "quickstart", config)
    r = subprocess.run([exe, "demo", f"CONFIG={config}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert 'Task "setup" is up to date' in out and "pip install" not in out
    assert "interrupted sim-" in out
    assert "replaces sim-" in out and "1 to create" in out
    assert out.rstrip().count("No changes. The fleet matches the desired state.") == 1
    assert re.search(r"jobs running(, \d+ starting)?, 1 reserved, 0 pending", out), out  # llm-pretrain has no run
