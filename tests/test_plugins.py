"""Third-party providers load through the `reconciler.providers` entry point group."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fleetkit import job, pool, tenant, topology, write_config

PLUGIN = Path(__file__).parent / "plugins" / "fleetops-onprem"


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> Path:
    """pip-install the plugin package into its own target directory (a real install)."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target), str(PLUGIN)],
                   check=True, capture_output=True)
    return target


def run(plugin_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_path), str(Path(__file__).parent.parent)])}
    return subprocess.run([sys.executable, "-m", "reconciler.cli", *args], env=env, capture_output=True, text=True, timeout=120)


def test_cli_finds_the_installed_plugin(plugin_path):
    out = run(plugin_path, "providers")
    assert out.returncode == 0
    assert "onprem\tonprem_provider:OnPremProvider" in out.stdout
    assert "sim\tproviders.sim:SimProvider" in out.stdout


def test_plugin_drives_a_full_apply(plugin_path, tmp_path):
    cfg = write_config(tmp_path / "cfg", [
        topology(clouds={"onprem": {"dc1": ["rack-a", "rack-b"]}}), tenant("t"),
        pool("dgx", "onprem", "dc1", ["rack-a", "rack-b"], ["dgx-a100"], hi=4),
        job("train", gpus=8, gpu_type="A100", cpu=100, mem=800, replicas=2),
        job("probe", gpus=2, gpu_type="A100", cpu=16, mem=64),
    ])
    applied = run(plugin_path, "apply", str(cfg), "--provider", "onprem", "--auto-approve")
    if applied.returncode != 0:
        # The rack's size shows only when a create fails (as a cloud's capacity does): the
        # plugin's CapacityError puts the rack in cool-off and the next run uses the other one.
        assert "rack in rack-" in applied.stderr and "is full" in applied.stderr, applied.stderr
        applied = run(plugin_path, "apply", str(cfg), "--provider", "onprem", "--auto-approve")
    assert applied.returncode == 0, applied.stderr
    again = run(plugin_path, "plan", str(cfg), "--provider", "onprem", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr
    import json
    servers = json.loads((cfg / ".reconcile" / "onprem.json").read_text())["servers"]
    assert len(servers) == 3  # two for the gang (one rack), one for the probe


def test_unknown_provider_is_a_clear_error(tmp_path):
    cfg = write_config(tmp_path / "cfg", [topology(), tenant("t")])
    out = subprocess.run([sys.executable, "-m", "reconciler.cli", "plan", str(cfg), "--provider", "nope"], capture_output=True, text=True)
    assert out.returncode == 1
    assert "unknown provider 'nope'; installed: aws, azure, gcp, sim" in out.stderr


def test_a_bug_in_a_plugin_is_one_paragraph_and_debug_shows_the_traceback(plugin_path, tmp_path):
    """The plugin chokes on a server record without its cloud (KeyError): the CLI's last resort, not a traceback."""
    import json

    from providers.base import TAG_FLEET

    cfg = write_config(tmp_path / "cfg", [topology(clouds={"onprem": {"dc1": ["rack-a"]}}), tenant("t"),
                                          pool("dgx", "onprem", "dc1", ["rack-a"], ["dgx-a100"], hi=1)])
    (cfg / ".reconcile").mkdir(exist_ok=True)
    (cfg / ".reconcile" / "onprem.json").write_text(json.dumps({"servers": {"dgx-001": {"id": "dgx-001", "tags": {TAG_FLEET: "test"}}}}))
    out = run(plugin_path, "plan", str(cfg), "--provider", "onprem")
    assert out.returncode == 1, out.stderr
    assert out.stderr.startswith("Error: unexpected KeyError: 'cloud'. This is a bug"), out.stderr
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
    for debug in (["--debug"], []):
        env_debug = {} if debug else {"FLEETOPS_DEBUG": "1"}
        env = {**os.environ, **env_debug, "PYTHONPATH": os.pathsep.join([str(plugin_path), str(Path(__file__).parent.parent)])}
        full = subprocess.run([sys.executable, "-m", "reconciler.cli", *debug, "plan", str(cfg), "--provider", "onprem"],
                              env=env, capture_output=True, text=True, timeout=120)
        assert full.returncode == 1
        assert "Traceback (most recent call last)" in full.stderr and "onprem_provider.py" in full.stderr, full.stderr
        assert full.stderr.rstrip().endswith(out.stderr.rstrip())
