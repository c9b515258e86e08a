"""Shared state and locking: the s3 backend against a real moto server over HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import boto3
import pytest

from reconciler import api
from reconciler.backend import S3Backend, backend_for
from reconciler.errors import LockError
from reconciler.state import State, state_dir
from tests.fleetkit import copy_quickstart
from tests.test_safety import cli_here

BUCKET = "fleet-state"


@pytest.fixture
def s3_env(aws_env, monkeypatch, request):
    from tests.conftest import AWS_ENV

    env = {**AWS_ENV, "AWS_ENDPOINT_URL_S3": aws_env}
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", aws_env)
    s3 = boto3.client("s3")
    bucket = f"{BUCKET}-{abs(hash(request.node.name)) % 10**8}"
    s3.create_bucket(Bucket=bucket)
    return env, f"s3://{bucket}/fleets/quickstart", s3, bucket


def test_state_round_trips_through_s3(s3_env, tmp_path):
    _, url, s3, bucket = s3_env
    backend = backend_for(tmp_path, url)
    assert isinstance(backend, S3Backend)
    assert backend.load().placements == {}
    st = State(placements={"job": ["i-1", "i-2"]}, serial=3)
    st.mark_short("aws", "us-east-1a", "p4d.24xlarge", "spot")
    backend.save(st)
    raw = json.loads(s3.get_object(Bucket=bucket, Key="fleets/quickstart/state.json")["Body"].read())
    assert raw["placements"] == {"job": ["i-1", "i-2"]} and raw["serial"] == 3
    again = backend.load()
    assert again.placements == st.placements and again.short_now() == st.short_now()


def test_apply_with_s3_state_converges_and_keeps_nothing_local(s3_env, tmp_path):
    _, url, s3, bucket = s3_env
    qs = copy_quickstart(tmp_path)
    api.apply(qs, state=url)
    assert not (state_dir(qs) / "state.json").exists()
    assert "placements" in json.loads(s3.get_object(Bucket=bucket, Key="fleets/quickstart/state.json")["Body"].read())
    assert not api.plan(qs, state=url).plan.has_changes
    # The lock object is gone once the apply is over.
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix="fleets/quickstart/lock.json")
    # Beside the state: the serial the apply began with (reconciler/placements.py), the serial it saved.
    started = json.loads(s3.get_object(Bucket=bucket, Key="fleets/quickstart/started.json")["Body"].read())
    assert started == {"serial": backend_for(qs, url).load().serial} == {"serial": backend_for(qs, url).load().started}


def test_lock_is_exclusive_and_names_its_holder(s3_env, tmp_path):
    _, url, _, _ = s3_env
    a, b = backend_for(tmp_path, url), backend_for(tmp_path, url)
    with a.lock() as held:
        with pytest.raises(LockError, match=f"another apply holds the lock s3://.*: {held} \\(pid {os.getpid()}"):
            with b.lock():
                pass
        with pytest.raises(LockError, match="refusing to break it"):
            b.unlock("not-the-holder")
    with b.lock():  # released: the next one gets it
        pass


def test_expired_lock_is_taken_over_and_unlock_breaks_a_live_one(s3_env, tmp_path):
    from datetime import timedelta

    _, url, s3, bucket = s3_env
    short = S3Backend(url, ttl=timedelta(seconds=-1))  # every lock it writes is already expired
    stuck = short.lock()
    stuck.__enter__()  # a runner that died holding the lock
    with backend_for(tmp_path, url).lock():
        pass
    live = backend_for(tmp_path, url)
    ctx = live.lock()
    lock_id = ctx.__enter__()
    from typer.testing import CliRunner
    from reconciler.cli import app
    out = CliRunner().invoke(app, ["unlock", lock_id, "--state", url])
    assert out.exit_code == 0, out.output
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix="fleets/quickstart/lock.json")
    # The broken holders finish later: they no longer hold the lock, so they delete nothing.
    with backend_for(tmp_path, url).lock():
        ctx.__exit__(None, None, None)
        stuck.__exit__(None, None, None)
        assert "Contents" in s3.list_objects_v2(Bucket=bucket, Prefix="fleets/quickstart/lock.json")


def test_two_concurrent_applies_exactly_one_proceeds(s3_env, tmp_path):
    """Two applies started together on one S3 state. Each is held at its first launch (tests/gates.py), inside the
    lock, until the other has exited: the one that got the lock cannot finish (and release it) before the other
    asks, however the machine schedules them (a slow cloud used to stand in for this; under load the first apply
    could end before the second started, and both proceeded). Were the lock not exclusive, both would be held."""
    from tests.gates import Gate

    env, url, _, _ = s3_env
    qs = copy_quickstart(tmp_path)
    gate = Gate(tmp_path / "gate", "sim", 0)
    penv = gate.env({**os.environ, **env, "FLEETOPS_STATE": url})
    cmd = [sys.executable, "-m", "reconciler.cli", "apply", str(qs), "--auto-approve"]
    procs = [subprocess.Popen(cmd, env=penv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        # Until each has either exited or reached the gate: the refused one can exit before the other has planned
        # (`apply` imports the solver only when it plans, so a refusal comes ~0.5 s sooner than it used to).
        gate.wait(lambda: all(p.poll() is not None or p.pid in gate.reached() for p in procs), what="one apply refused")
        held = gate.reached()
        assert len(held) == 1, f"{len(held)} applies got the lock at once"
        loser = next(p for p in procs if p.pid not in held)
        loser_out = (loser.wait(timeout=300), *loser.communicate())
        gate.release()
        winner = next(p for p in procs if p.pid in held)
        winner_out = (winner.wait(timeout=300), *winner.communicate())
    finally:
        gate.release()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert loser_out[0] == 1 and winner_out[0] == 0, (loser_out, winner_out)
    assert "another apply holds the lock s3://" in loser_out[2] and "reconcile unlock" in loser_out[2]
    assert "Applied plan" in winner_out[1]
    assert not api.plan(qs, state=url).plan.has_changes


@pytest.mark.parametrize("url", ["s3://AKIA:SECRETSHOULDNOTPRINT@bucket/p", "gs://user:SECRETSHOULDNOTPRINT@bucket/p",
                                 "azblob://key:SECRETSHOULDNOTPRINT@account/container/p",
                                 "azblob://account/container/p?sv=2022-11-02&sp=rwdl&sig=SECRETSHOULDNOTPRINT",
                                 "s3://bucket/p?X-Amz-Credential=AKIA&X-Amz-Signature=SECRETSHOULDNOTPRINT",
                                 "gs://bucket/p?SECRETSHOULDNOTPRINT", "s3://bucket/p#SECRETSHOULDNOTPRINT"])
def test_credentials_in_a_state_url_are_refused_and_never_printed(url, tmp_path):
    """botocore's "Invalid bucket name" message echoed the whole netloc, key and secret included. A query string (an
    Azure SAS, a presigned URL's signature pasted after the prefix) was taken and ignored by the backend, and the URL
    as given went into every launched instance's user data (the agent's --state: readable by every process there,
    and by DescribeInstanceAttribute), the sim agents' target.json and command lines."""
    from reconciler.errors import ReconcileError

    with pytest.raises(ReconcileError) as e:
        backend_for(tmp_path, url)
    assert "credentials do not go in the URL" in str(e.value) and "SECRETSHOULDNOTPRINT" not in str(e.value)
    # (in this process: a traceback it let through is in r.stderr too) `status` of a directory never applied stops at "No
    # status yet" before it reads the URL; `plan` of a config reads it, and refuses it
    for args in (("status", tmp_path), ("plan", copy_quickstart(tmp_path))):
        r = cli_here(*args, "--state", url)
        assert r.returncode == 1 and "SECRETSHOULDNOTPRINT" not in r.stdout + r.stderr, r.stderr
    assert "credentials do not go in the URL" in r.stderr, r.stderr


def test_a_malformed_aws_credentials_file_is_an_error_naming_it_not_a_bug(tmp_path, monkeypatch):
    """Secrets audit: a malformed ~/.aws/credentials was "unexpected ConfigParseError ... This is a bug in reconcile",
    from the AWS provider and the s3 backend alike. It is an error naming the file (botocore's message names it, never
    its contents), and what to do."""
    from providers.aws import AwsProvider
    from providers.base import ProviderContext
    from reconciler.errors import ReconcileError

    bad = tmp_path / "credentials"
    bad.write_text("[default]\naws_access_key_id = AKIA\n  stray line\n=SECRET-VALUE\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(bad))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "absent"))
    for make in (lambda: AwsProvider(ProviderContext(fleet="f", state_dir=tmp_path, options={})),
                 lambda: backend_for(tmp_path, "s3://bucket/prefix")):
        with pytest.raises(ReconcileError) as e:
            make()
        assert f"Unable to parse config file: {bad}" in str(e.value) and "SECRET-VALUE" not in str(e.value), str(e.value)


def test_a_malformed_azure_storage_connection_string_is_an_error_not_a_bug(tmp_path, monkeypatch):
    """Secrets audit: a malformed AZURE_STORAGE_CONNECTION_STRING was "unexpected ValueError: Connection string is either
    blank or malformed ... a bug in reconcile". An error naming the variable, never its value."""
    from reconciler.errors import ReconcileError

    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "AccountName=acct;garbage-PLANTED-secret")
    with pytest.raises(ReconcileError) as e:
        backend_for(tmp_path, "azblob://acct/container/prefix")
    assert "AZURE_STORAGE_CONNECTION_STRING is not a connection string" in str(e.value) and "PLANTED" not in str(e.value)


def test_a_broken_google_credentials_file_is_said_to_be_broken_not_missing(tmp_path, monkeypatch):
    """Secrets audit: GOOGLE_APPLICATION_CREDENTIALS naming a truncated file was reported as "no Google credentials found",
    which sent people to log in again. The file is named as unreadable as credentials; no key material is printed."""
    from providers.base import ProviderContext
    from providers.gcp import GcpProvider
    from reconciler.errors import ReconcileError

    bad = tmp_path / "sa.json"
    bad.write_text('{"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----PLANTED')
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(bad))
    for make in (lambda: backend_for(tmp_path, "gs://bucket/prefix"),
                 lambda: GcpProvider(ProviderContext(fleet="f", state_dir=tmp_path, options={"project": "p"}))):
        with pytest.raises(ReconcileError) as e:
            make()
        assert f"GOOGLE_APPLICATION_CREDENTIALS names {bad}, which could not be read as credentials" in str(e.value), str(e.value)
        assert "PLANTED" not in str(e.value)


@pytest.mark.slow  # (7.6 s: the quickstart applied and planned on a moto S3)
def test_the_real_hosts_tags_saying_it_hosts_nothing_move_no_work_on_s3_state(s3_env, tmp_path):
    """The forged-tags attack on a shared state (tests/test_placement_tags.py has it on the local one): started.json
    gone (the first apply after the upgrade), the tags of an instance the state places work on rewritten one serial past
    the state's to say it hosts nothing. The plan took its work for gone and placed it again; now it changes nothing."""
    from providers.placements import PlacementRecord, placement_tags
    from providers.sim import SimCloud

    _, url, s3, bucket = s3_env
    qs = copy_quickstart(tmp_path)
    api.apply(qs, state=url)
    s3.delete_object(Bucket=bucket, Key="fleets/quickstart/started.json")
    saved = backend_for(qs, url).load()
    assert saved.started is None
    host = min(saved.placements.values())[0]
    with SimCloud(state_dir(qs)).world() as w:
        w["instances"][host]["tags"].update(placement_tags(PlacementRecord(saved.serial + 1)))
    res = api.plan(qs, state=url)
    assert not res.plan.has_changes, [(j.job, j.action) for j in res.plan.jobs if j.action != "keep"]
    assert {j: tuple(ids) for j, ids in saved.placements.items()} == res.observed.placements
    assert any(n.startswith(f"{host}: its tags (serial {saved.serial + 1})") and n.endswith("left on it") for n in res.plan.notes)


def test_oversized_state_bus_and_lock_objects_are_refused_unread(s3_env, monkeypatch, tmp_path):
    from tests.test_cloud_backends import check_oversized_objects_are_refused

    _, url, s3, bucket = s3_env

    def get(key):
        try:
            return s3.get_object(Bucket=bucket, Key=f"fleets/quickstart/{key}")["Body"].read()
        except s3.exceptions.NoSuchKey:
            return None

    check_oversized_objects_are_refused(url, lambda k, b: s3.put_object(Bucket=bucket, Key=f"fleets/quickstart/{k}", Body=b), get,
                                        monkeypatch, tmp_path)
