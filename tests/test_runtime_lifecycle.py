"""What the reconciler reads back from the agents, as a pure function of plain data."""

from __future__ import annotations

from reconciler.load import load
from reconciler.runtime.assign import build_assignments, spec_hash
from reconciler.runtime.lifecycle import runtime_view, unhealthy_instances
from tests.fleetkit import job, pool, tenant, topology, write_config

NOW = 1_000_000.0


def desired(tmp_path, **spec):
    return load(write_config(tmp_path, [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"]),
                                        job("j", cpu=1, replicas=2, run={"command": ["train"]}, **spec)]))


def rec(d, replica, instance, phase, **kw):
    return {"job": "j", "replica": replica, "instance": instance, "spec_hash": spec_hash(d.jobs["j"]), "epoch": 1, "attempt": 0,
            "restarts": 0, "phase": phase, "reason": kw.pop("reason", phase), "terminal": phase in ("Succeeded", "Failed"), **kw}


def beat(age: float, state: str = "Ready", running=()):
    return {"heartbeat_at": NOW - age, "state": state, "running": list(running)}


def test_phases_follow_the_replicas_and_heartbeats(tmp_path):
    d = desired(tmp_path)
    placed = {"j": ["i-1", "i-2"]}
    agents = {"i-1": beat(1), "i-2": beat(1)}
    both = {("j", 0): rec(d, 0, "i-1", "Running"), ("j", 1): rec(d, 1, "i-2", "Running")}
    assert runtime_view(d, placed, both, agents, ["i-1", "i-2"], NOW, 60).jobs["j"].phase == "Running"
    one = {("j", 0): rec(d, 0, "i-1", "Running")}
    assert runtime_view(d, placed, one, agents, ["i-1", "i-2"], NOW, 60).jobs["j"].phase == "Starting"
    # A silent agent: never Running, AgentUnreachable, and a lost node to replace.
    silent = {"i-1": beat(1), "i-2": beat(300)}
    v = runtime_view(d, placed, both, silent, ["i-1", "i-2"], NOW, 60)
    assert v.jobs["j"].phase == "Unknown" and v.jobs["j"].reason == "AgentUnreachable"
    assert "lost node" in v.unhealthy["i-2"] and "i-1" not in v.unhealthy
    # Never reported: booting within the allowance, unreachable after it; never a lost node.
    v = runtime_view(d, placed, {}, {"i-1": beat(1)}, ["i-1", "i-2"], NOW, 60, launched={"i-2": NOW - 30}, boot=600)
    assert v.jobs["j"].phase == "Starting" and not v.unhealthy
    v = runtime_view(d, placed, {}, {"i-1": beat(1)}, ["i-1", "i-2"], NOW, 60, launched={"i-2": NOW - 900}, boot=600)
    assert v.jobs["j"].phase == "Unknown" and not v.unhealthy


def test_finished_jobs_stop_demanding_capacity_until_the_spec_changes(tmp_path):
    d = desired(tmp_path)
    done = {("j", 0): rec(d, 0, "i-1", "Succeeded"), ("j", 1): rec(d, 1, "i-2", "Succeeded")}
    v = runtime_view(d, {}, done, {}, [], NOW, 60)
    assert v.finished == {"j": "Succeeded"} and v.jobs["j"].phase == "Succeeded"
    half = {("j", 0): rec(d, 0, "i-1", "Succeeded")}
    assert runtime_view(d, {"j": ["i-1", "i-2"]}, half, {"i-1": beat(1), "i-2": beat(1)}, [], NOW, 60).finished == {}
    failed = {("j", 1): rec(d, 1, "i-2", "Failed", reason="BackoffLimitExceeded", message="exit code 1")}
    v = runtime_view(d, {}, failed, {}, [], NOW, 60)
    assert v.finished == {"j": "Failed"} and v.jobs["j"].reason == "BackoffLimitExceeded"
    changed = desired(tmp_path / "b", time_limit_hours=2)  # another spec: the old records do not count
    assert runtime_view(changed, {}, done, {}, [], NOW, 60).finished == {}


def test_an_interrupting_instance_is_replaced_once_its_replicas_stopped():
    assert unhealthy_instances(["i-1"], {"i-1": beat(1, "Interrupting", ["j/0"])}, NOW, 60) == {}
    assert "interruption notice" in unhealthy_instances(["i-1"], {"i-1": beat(1, "Interrupting")}, NOW, 60)["i-1"]
    assert "stopped" in unhealthy_instances(["i-1"], {"i-1": beat(1, "Stopped")}, NOW, 60)["i-1"]


def test_assignments_carry_the_gang_and_a_new_epoch_only_when_the_placement_changes(tmp_path):
    d = desired(tmp_path)
    first = build_assignments(d, {"j": ["i-1", "i-1"]}, {"j": [[0, 1], [2, 3]]}, {"i-1": "aws"}, 5, {})
    (r0, r1) = first["i-1"]["replicas"]
    assert (r0["local_rank"], r1["local_rank"]) == (0, 1) and r0["world_size"] == 2 and r1["gpus"] == ["2", "3"]
    assert r0["master_instance"] == "i-1" and r0["master_port"] == 29500 and r0["epoch"] == 5
    same = build_assignments(d, {"j": ["i-1", "i-1"]}, {"j": [[0, 1], [2, 3]]}, {"i-1": "aws"}, 6, first)
    assert same["i-1"]["replicas"][0]["epoch"] == 5
    moved = build_assignments(d, {"j": ["i-1", "i-9"]}, {}, {"i-1": "aws", "i-9": "aws"}, 7, first)
    assert moved["i-9"]["replicas"][0]["epoch"] == 7 and moved["i-1"]["replicas"][0]["epoch"] == 7
