"""The workload in the Job spec: `run`, `mode`, `restart`, `time_limit_hours`, `checkpoint`."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from reconciler.cli import app
from reconciler.errors import ConfigError
from reconciler.load import load
from tests.fleetkit import job, pool, tenant, topology, write_config


def _config(tmp_path, **spec):
    j = job("train", cpu=1, **spec)
    return write_config(tmp_path, [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"]), j])


def _errors(path) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load(path)
    return [str(d) for d in e.value.diagnostics]


def test_a_job_with_run_loads_with_its_defaults(tmp_path):
    d = load(_config(tmp_path, run={"image": "ghcr.io/acme/train:1.4", "command": ["python", "train.py"], "env": {"WANDB_MODE": "offline"}},
                     checkpoint={"dir": "/ckpt", "signal": "SIGUSR1", "grace_seconds": 90}, time_limit_hours=48))
    s = d.jobs["train"].spec
    assert s.run.command == ["python", "train.py"] and s.run.env == {"WANDB_MODE": "offline"}
    assert s.run_mode == "batch" and s.restart_policy.policy == "OnFailure" and s.restart_policy.backoff_limit == 3
    assert s.checkpoint.signal == "SIGUSR1" and s.checkpoint.grace_seconds == 90 and s.time_limit_hours == 48


def test_a_job_without_run_is_a_reservation_as_before(tmp_path):
    s = load(_config(tmp_path)).jobs["train"].spec
    assert s.run is None and s.mode is None and s.restart is None and s.checkpoint is None


@pytest.mark.parametrize(
    "spec, field, fragment",
    [
        ({"run": {"image": "x"}}, "spec.run.command", "Field required"),
        ({"run": {"command": []}}, "spec.run.command", "at least 1 item"),
        ({"run": {"command": ["true"]}, "restart": {"policy": "Always"}}, "spec.restart.policy", "'OnFailure' or 'Never'"),
        ({"run": {"command": ["true"]}, "restart": {"backoff_limit": -1}}, "spec.restart.backoff_limit", "greater than or equal to 0"),
        ({"run": {"command": ["true"]}, "mode": "cron"}, "spec.mode", "'batch' or 'service'"),
        ({"run": {"command": ["true"]}, "checkpoint": {"dir": "/c", "signal": "SIGKILL"}}, "spec.checkpoint.signal", "Input should be"),
        ({"run": {"command": ["true"]}, "time_limit_hours": 0}, "spec.time_limit_hours", "greater than 0"),
        ({"run": {"command": ["true"], "env": {"1BAD": "x"}}}, "spec.run.env.1BAD", "pattern"),
        ({"run": {"command": "python train.py"}}, "spec.run.command", "valid list"),
        ({"restart": {"policy": "Never"}}, "spec", "add run.command"),
    ],
)
def test_bad_workload_is_a_file_line_error(tmp_path, spec, field, fragment):
    errs = _errors(_config(tmp_path, **spec))
    assert any(e.startswith("fleet.yaml:") and f"Job/train: {field}: " in e and fragment in e for e in errs), errs
    # The line is the field's own line in the file, not the document's first.
    line = int(next(e for e in errs if f"Job/train: {field}" in e).split(":")[1])
    assert line > 1


def test_cli_validate_refuses_run_without_command(tmp_path):
    out = CliRunner().invoke(app, ["validate", str(_config(tmp_path, run={"image": "x"}))])
    assert out.exit_code == 1
    assert "spec.run.command: Field required" in out.output
