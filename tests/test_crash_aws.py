"""SIGKILL `reconcile apply` against the moto server mid-flight, then rerun: the ClientToken
derived from the plan must make the rerun find, not duplicate, what the killed run launched,
and nothing the fleet owns may be left hosting nothing.

moto answers in milliseconds, too fast to kill an apply between two launches by watching the
cloud (and on a loaded machine a poll saw the n-th instance only after more were launched), so
the killed process is held at an exact launch (tests/gates.py: its RunInstances calls, in that
process only): after n launches and before the next is sent, or with the n-th launch made and
its answer never seen. The rerun runs at full speed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from reconciler import api
from tests.conftest import AWS_ENV
from tests.fleetkit import copy_example
from tests.gates import Gate


def _fleet(tmp_path: Path, name: str) -> Path:
    """examples/aws-only (4 instances) under its own fleet name: the kill points share one moto server."""
    cfg = copy_example(tmp_path, "aws-only")
    f = cfg / "fleet.yaml"
    f.write_text(f.read_text().replace("metadata: {name: aws-fleet}", f"metadata: {{name: {name}}}"))
    return cfg


def _live(ec2s, fleet: str) -> list[dict]:
    """The fleet's live instances in every region the example uses, read by our own boto3 clients."""
    out = []
    for ec2 in ec2s:
        pages = ec2.get_paginator("describe_instances").paginate(Filters=[
            {"Name": "tag:fleetops.io/fleet", "Values": [fleet]},
            {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}])
        out += [i for p in pages for r in p["Reservations"] for i in r["Instances"]]
    return out


def _kill_after_launches(cfg: Path, fleet: str, n: int, url: str, ec2, gate: Gate) -> int:
    # One launch at a time in the killed run (apply launches concurrently by default), so the hold is between two.
    proc = subprocess.Popen([sys.executable, "-m", "reconciler.cli", "apply", str(cfg), "--auto-approve", "--provider", "aws",
                             "-o", f"endpoint_url={url}", "-o", "parallelism=1"], env=gate.env({**os.environ, **AWS_ENV}),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        gate.wait(lambda: proc.pid in gate.reached() or proc.poll() is not None, what=f"the apply held after {n} launches")
        finished = proc.poll() is not None
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not finished, "the apply ended before the kill point: the kill tested nothing"
    return len(_live(ec2, fleet))


def _assert_converged(cfg: Path, fleet: str, url: str, ec2) -> None:
    opts = {"endpoint_url": url}
    res = api.apply(cfg, provider="aws", options=opts)
    assert res.report.ok, res.report.failures
    again = api.plan(cfg, provider="aws", options=opts)
    assert not again.plan.has_changes
    live = _live(ec2, fleet)
    tokens = [i["ClientToken"] for i in live]
    assert len(tokens) == len(set(tokens)), "duplicate instance for one create key"
    hosting = {i for j in again.plan.jobs for i in j.instances}
    assert {i["InstanceId"] for i in live} == hosting, "leaked: a managed instance hosts nothing"
    assert len(live) == 4


def _kill_and_rerun(tmp_path: Path, url: str, n: int, mode: str = "before") -> None:
    fleet = f"aws-kill-{n}-{tmp_path.name[-12:].lower().replace('_', '-')}"
    cfg = _fleet(tmp_path, fleet)
    ec2 = [boto3.client("ec2", region_name=r, endpoint_url=url) for r in ("us-east-1", "us-west-2")]
    left = _kill_after_launches(cfg, fleet, n, url, ec2, Gate(tmp_path / "gate", "aws", n, mode))
    assert left == n  # killed with exactly n of the 4 launched, the state not saved
    _assert_converged(cfg, fleet, url, ec2)


@pytest.mark.parametrize("kill_at", [1, 3])
def test_sigkill_mid_apply_on_moto_then_rerun(aws_env, tmp_path, kill_at):
    _kill_and_rerun(tmp_path, aws_env, kill_at)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["before", "answer-lost"])
@pytest.mark.parametrize("kill_at", [1, 2, 3])
def test_sigkill_mid_apply_on_moto_slow_tier(aws_env, tmp_path, kill_at, mode):
    """Every launch boundary, and every launch whose answer the killed apply never saw (the rerun must find that
    instance by its ClientToken, not launch a second)."""
    _kill_and_rerun(tmp_path, aws_env, kill_at, mode)
