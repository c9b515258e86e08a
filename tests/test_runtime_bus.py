"""The bus on the state backend: local `.reconcile/` and s3:// against the real moto server."""

from __future__ import annotations

import json

import boto3
import pytest

from reconciler.backend import backend_for
from reconciler.errors import ReconcileError
from reconciler.runtime.bus import Bus


@pytest.fixture
def s3_bus(aws_env, monkeypatch, request, tmp_path):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", aws_env)
    s3 = boto3.client("s3")
    bucket = f"bus-{abs(hash(request.node.name)) % 10**8}"
    s3.create_bucket(Bucket=bucket)
    return Bus(backend_for(tmp_path, f"s3://{bucket}/fleets/demo")), s3, bucket


def _round_trip(bus: Bus) -> None:
    assert bus.assignment("i-1") is None and bus.assignments() == {} and bus.runs() == {} and bus.agents() == {}
    bus.put_assignment("i-1", {"serial": 3, "replicas": [{"job": "train", "replica": 0}]})
    bus.put_assignment("i-2", {"serial": 3, "replicas": []})
    bus.put_run("train", 0, {"phase": "Running"})
    bus.put_run("train", 1, {"phase": "Starting"})
    bus.put_run("eval", 0, {"phase": "Succeeded"})
    bus.put_agent("i-1", {"heartbeat": 1.0})
    assert bus.assignment("i-1")["serial"] == 3
    assert sorted(bus.assignments()) == ["i-1", "i-2"]
    assert bus.runs() == {("eval", 0): {"phase": "Succeeded"}, ("train", 0): {"phase": "Running"}, ("train", 1): {"phase": "Starting"}}
    assert set(bus.runs("train")) == {("train", 0), ("train", 1)}
    assert bus.agents() == {"i-1": {"heartbeat": 1.0}}
    bus.delete_assignment("i-2")
    assert list(bus.assignments()) == ["i-1"]
    for bad in ("../state.json", "/etc/passwd", "runs/../../x", ""):
        with pytest.raises(ReconcileError, match="invalid bus key"):
            bus.store.read_key(bad)


def test_local_bus_round_trips_under_dot_reconcile(tmp_path):
    bus = Bus(backend_for(tmp_path, None))
    _round_trip(bus)
    assert json.loads((tmp_path / ".reconcile/runs/train/0.json").read_text()) == {"phase": "Running"}
    assert not list((tmp_path / ".reconcile").rglob("*.tmp"))


def test_s3_bus_round_trips_against_moto(s3_bus):
    bus, s3, bucket = s3_bus
    _round_trip(bus)
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == ["fleets/demo/agents/i-1.json", "fleets/demo/assignments/i-1.json", "fleets/demo/runs/eval/0.json",
                    "fleets/demo/runs/train/0.json", "fleets/demo/runs/train/1.json"]


def test_a_corrupt_bus_object_names_the_key(tmp_path):
    bus = Bus(backend_for(tmp_path, None))
    (tmp_path / ".reconcile/agents").mkdir(parents=True)
    (tmp_path / ".reconcile/agents/i-9.json").write_text("{not json")
    with pytest.raises(ReconcileError, match=r"agents/i-9.json is not valid JSON; delete it"):
        bus.agents()


def test_an_unreachable_s3_bus_is_a_clear_error(aws_env, monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    bus = Bus(backend_for(tmp_path, "s3://nowhere/fleet"))
    with pytest.raises(ReconcileError, match="s3 bus: cannot read s3://nowhere/fleet/assignments/i-1.json"):
        bus.assignment("i-1")
