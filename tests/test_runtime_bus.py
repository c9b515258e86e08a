"""The bus on the state backend: local `.reconcile/` and s3:// against the real moto server."""

from __future__ import annotations

import json
import time
from collections import Counter

import boto3
import pytest
import urllib3

from reconciler.backend import backend_for
from reconciler.errors import CorruptBusObjectError, ReconcileError
from providers.files import loads_json
from reconciler.runtime.bus import CLOCK_AHEAD, READ_ONLY_FIELDS, SEEN_AT, Bus, now_unix, reports_alive


@pytest.fixture
def s3_bus(aws_env, monkeypatch, request, tmp_path):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", aws_env)
    s3 = boto3.client("s3")
    bucket = f"bus-{abs(hash(request.node.name)) % 10**8}"
    s3.create_bucket(Bucket=bucket)
    return Bus(backend_for(tmp_path, f"s3://{bucket}/fleets/demo")), s3, bucket


def _round_trip(bus: Bus) -> None:
    assert bus.assignment("i-1") is None and bus.assignments() == {} and bus.runs() == {} and bus.agents() == {}
    bus.put_assignment("i-1", {"serial": 3, "replicas": [{"job": "train", "replica": 0, "spec_hash": "h", "epoch": 3, "run": {"command": ["x"]}}]})
    bus.put_assignment("i-2", {"serial": 3, "replicas": []})
    bus.put_run("train", 0, {"phase": "Running"})
    bus.put_run("train", 1, {"phase": "Starting"})
    bus.put_run("eval", 0, {"phase": "Succeeded"})
    bus.put_agent("i-1", {"heartbeat_at": 1.0})
    assert bus.assignment("i-1")["serial"] == 3
    assert sorted(bus.assignments()) == ["i-1", "i-2"]
    assert bus.runs() == {("eval", 0): {"phase": "Succeeded"}, ("train", 0): {"phase": "Running"}, ("train", 1): {"phase": "Starting"}}
    assert set(bus.runs("train")) == {("train", 0), ("train", 1)}
    # A report as read carries the store's record of its write (its clock, not the writer's: heartbeat_at 1.0 is a
    # host clock 56 years slow), never written back.
    report = bus.agents()["i-1"]
    assert {k: v for k, v in report.items() if k not in READ_ONLY_FIELDS} == {"heartbeat_at": 1.0}
    assert abs(report[SEEN_AT] - now_unix()) < 5 and abs(report[CLOCK_AHEAD] + now_unix()) < 5, report
    assert reports_alive(report, now_unix(), 60)
    bus.put_agent("i-1", report)
    assert set(loads_json(bus.store.read_key("agents/i-1.json"))) == {"heartbeat_at"}
    time.sleep(1.5)
    stamped = bus.store.read_key_stamped("agents/i-1.json")
    assert 0 <= stamped.age <= 5 and abs(stamped.modified - (time.time() - 1.5)) < 3, stamped  # (S3's: whole seconds)
    assert bus.store.read_key_stamped("agents/i-9.json") is None
    bus.delete_assignment("i-2")
    assert list(bus.assignments()) == ["i-1"]
    for bad in ("../state.json", "/etc/passwd", "runs/../../x", ""):
        with pytest.raises(ReconcileError, match="invalid bus key"):
            bus.store.read_key(bad)


def count_requests(monkeypatch) -> Counter[str]:
    """Every HTTP request this process sends from now on, by method (all three SDKs send through urllib3's pools)."""
    sent: Counter[str] = Counter()
    urlopen = urllib3.connectionpool.HTTPConnectionPool.urlopen

    def counted(pool, method, url, *args, **kwargs):
        sent[method] += 1
        return urlopen(pool, method, url, *args, **kwargs)

    monkeypatch.setattr(urllib3.connectionpool.HTTPConnectionPool, "urlopen", counted)
    return sent


def reading_five_reports_costs(bus: Bus, monkeypatch) -> Counter[str]:
    """The requests Bus.agents sends to read five agents' reports, each judged by the store's clock: one listing and
    one GET a report, not two (GCS: metadata, then that generation's body) -- a plan over N agents paid 2N + 1."""
    for i in range(5):
        bus.put_agent(f"i-{i}", {"heartbeat_at": 1.0, "state": "Ready"})
    sent = count_requests(monkeypatch)
    reports = bus.agents()
    assert sorted(reports) == [f"i-{i}" for i in range(5)]
    for report in reports.values():  # (each by the store's record of its write: heartbeat_at 1.0 is 56 years slow)
        assert abs(report[SEEN_AT] - now_unix()) < 5 and reports_alive(report, now_unix(), 60), report
    return sent


def test_s3_reads_every_agents_report_in_one_request_each_plus_the_listing(s3_bus, monkeypatch):
    assert reading_five_reports_costs(s3_bus[0], monkeypatch) == {"GET": 6}


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
    with pytest.raises(ReconcileError, match=r"agents/i-9.json is not valid JSON \(Expecting property name .*\); delete it"):
        bus.agents()


# (key, a wrong-typed object a reader once met as a TypeError/ValueError, what the error names)
WRONG_TYPES = [
    ("agents/i-9.json", {"heartbeat_at": "soon", "state": "Ready"}, "heartbeat_at \"soon\", not a unix time"),
    ("agents/i-9.json", {"state": "Ready"}, "has no heartbeat_at"),
    ("agents/i-9.json", {"heartbeat_at": 1e300}, "not a unix time"),
    ("agents/i-9.json", {"heartbeat_at": 5.0, "running": "a/0"}, "running \"a/0\""),
    ("runs/train/0.json", {"restarts": "x", "spec_hash": "h"}, "restarts \"x\", not a count"),
    ("runs/train/0.json", {"started_at": 5}, "started_at 5, not a time"),
    ("runs/train/0.json", {"log_tail": "oops"}, "log_tail"),
    ("runs/train/0.json", [1, 2], "is not a JSON object"),
    ("assignments/i-9.json", {"serial": 1, "published_at": "x"}, "published_at \"x\", not a unix time"),
    ("assignments/i-9.json", {"serial": "1"}, "serial \"1\""),
    ("assignments/i-9.json", {"serial": 1, "replicas": [{"job": "a", "replica": 0}]}, "replicas"),
    ("assignments/i-9.json", {"serial": 1, "replicas": [{"job": "a", "replica": 0, "spec_hash": "h", "epoch": 1, "run": {"command": ["x"]},
                                                         "checkpoint": {"dir": "/c", "signal": "SIGNOPE"}}]}, "replicas"),
]


@pytest.mark.parametrize("key,doc,needle", WRONG_TYPES, ids=[f"{k}:{n[:20]}" for k, _, n in WRONG_TYPES])
def test_wrong_types_in_a_bus_object_name_the_key_and_field(tmp_path, key, doc, needle):
    """Before, these reached the readers: `unexpected ValueError/TypeError` from plan, apply and status."""
    bus = Bus(backend_for(tmp_path, None))
    path = tmp_path / ".reconcile" / key
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(doc))
    kind = key.split("/")[0]
    read = {"agents": lambda: bus.agent("i-9"), "runs": lambda: bus.run("train", 0), "assignments": lambda: bus.assignment("i-9")}[kind]
    with pytest.raises(CorruptBusObjectError) as err:
        read()
    assert str(err.value).startswith(f"bus object {key} ") and needle in str(err.value), err.value
    assert str(err.value).endswith("delete it and its writer rewrites it")


def test_the_agents_reports_are_read_past_one_bad_object(tmp_path):
    """The bulk readers of the agents' reports skip a corrupt object (garbled or wrong types alike) and name it."""
    bus = Bus(backend_for(tmp_path, None))
    bus.put_agent("i-1", {"heartbeat_at": 5.0, "state": "Ready"})
    bus.put_run("train", 0, {"phase": "Running", "restarts": 0})
    (tmp_path / ".reconcile/agents/i-2.json").write_text('{"heartbeat_at": "soon"}')
    (tmp_path / ".reconcile/agents/i-3.json").write_text("{not json")
    (tmp_path / ".reconcile/runs/train/1.json").write_text('{"restarts": "x"}')
    skipped: dict[str, str] = {}
    assert {i: {k: v for k, v in a.items() if k not in READ_ONLY_FIELDS} for i, a in bus.agents(skipped=skipped).items()} == \
        {"i-1": {"heartbeat_at": 5.0, "state": "Ready"}}
    assert bus.runs(skipped=skipped) == {("train", 0): {"phase": "Running", "restarts": 0}}
    assert sorted(skipped) == ["agents/i-2.json", "agents/i-3.json", "runs/train/1.json"]
    assert "is not valid JSON" in skipped["agents/i-3.json"] and "restarts" in skipped["runs/train/1.json"]
    with pytest.raises(CorruptBusObjectError):
        bus.runs()  # without `skipped`: the error, as for any reader that must not go on without it


def test_an_unreachable_s3_bus_is_a_clear_error(aws_env, monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    bus = Bus(backend_for(tmp_path, "s3://nowhere/fleet"))
    with pytest.raises(ReconcileError, match="s3 bus: cannot read s3://nowhere/fleet/assignments/i-1.json"):
        bus.assignment("i-1")
