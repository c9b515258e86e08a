"""An agent's liveness judged by the state store's clock, never by its host's (heartbeat_at): a live agent on a host
whose clock is minutes behind is not a lost node (its instance replaced under other teams' work, its key deleted while
it stops a replica, its gang stopped), and a dead one whose clock was ahead is not alive for ever. On the local backend
the store's clock is the file's mtime against this host's time; the object stores' are tested in test_runtime_bus and
test_cloud_backends (_round_trip)."""

from __future__ import annotations

import json

from reconciler.backend import backend_for
from reconciler.runtime.agent import peer_lost
from reconciler.runtime.bus import Bus, now_unix, stale_seconds
from reconciler.runtime.publish import publish, shutting_down
from tests.fleetkit import report_written_ago
from tests.test_runtime_lifecycle import _rt3, _running_report, desired

BEHIND = -120.0  # a host clock two minutes slow: past the 60 s stale limit at every beat


def _skewed(bus: Bus, iid: str, ahead: float, **fields) -> None:
    """What a live agent writes now from a host whose clock is `ahead` seconds off."""
    bus.put_agent(iid, {**(bus.agent(iid) or {"instance": iid, "state": "Ready", "running": []}), **fields,
                        "heartbeat_at": now_unix() + ahead})


def test_a_live_agent_on_a_host_whose_clock_is_behind_is_not_a_lost_node_and_status_names_the_skew(tmp_path):
    """Its instance was replaced at every plan (a live instance running other teams' work deleted) and status said
    Unknown, while its agent beat every 5 s. Now: Running, nothing replaced, and status names the skew (fix NTP)."""
    cfg, runner, app = _rt3(tmp_path)
    iid = json.loads((cfg / ".reconcile" / "state.json").read_text())["placements"]["slow"][0]
    bus = _running_report(cfg, iid)
    _skewed(bus, iid, BEHIND, state="Ready", notice=None)
    plan = runner.invoke(app, ["plan", str(cfg), "--time-limit", "10", "--format", "json"])
    assert plan.exit_code == 0, plan.output
    body = json.loads(plan.stdout)
    assert body["deletes"] == [] and body["kept"] == {iid: body["kept"][iid]}, body["deletes"]  # not replaced: kept
    assert not [n for n in body["notes"] if iid in n], body["notes"]
    st = json.loads(runner.invoke(app, ["status", str(cfg), "--format", "json"]).stdout)
    assert st["jobs"]["slow"]["status"]["phase"] == "Running", st["jobs"]["slow"]["status"]
    skew = st["agents"][iid]
    assert skew["reason"] == "ClockSkew" and "120s behind the state store's" in skew["message"], skew
    assert "ClockSkew" in runner.invoke(app, ["status", str(cfg)]).output


def test_a_dead_agent_whose_host_clock_was_ahead_is_a_lost_node(tmp_path):
    """An agent whose clock ran an hour ahead wrote heartbeat_at an hour in the future, then its host died: it looked
    alive for an hour (its job Running, its instance kept). Its report was last written 2 minutes ago: lost."""
    cfg, runner, app = _rt3(tmp_path)
    iid = json.loads((cfg / ".reconcile" / "state.json").read_text())["placements"]["slow"][0]
    bus = _running_report(cfg, iid)
    _skewed(bus, iid, 3600.0, state="Ready", notice=None)
    report_written_ago(cfg, iid, 120)
    st = json.loads(runner.invoke(app, ["status", str(cfg), "--format", "json"]).stdout)["jobs"]["slow"]["status"]
    assert (st["phase"], st["run"]["reason"]) == ("Unknown", "AgentUnreachable"), st
    plan = runner.invoke(app, ["plan", str(cfg), "--time-limit", "10"])
    assert f"instance {iid} is replaced: lost node" in plan.output, plan.output


def test_a_deleted_instances_key_stays_while_its_skewed_agent_stops_a_replica(tmp_path):
    """apply keeps a deleted instance's heartbeat key while its agent still stops replicas (a moved copy waits for it):
    an agent whose clock is behind looked stale, its key was deleted, and the moved copy started beside the old one,
    one rank twice. A dead one whose clock was ahead kept its key (its moved copy waited out the grace for nothing)."""
    cfg = tmp_path / "c"
    d = desired(cfg)
    backend = backend_for(cfg)
    bus = Bus(backend)
    _skewed(bus, "i-stopping", BEHIND, running=["j/0"])
    _skewed(bus, "i-dead", 3600.0, running=["j/1"])
    report_written_ago(cfg, "i-dead", 120)
    assert shutting_down(bus, "i-stopping") and not shutting_down(bus, "i-dead")
    publish(backend, d, {}, {}, 1, [], {}, cfg, None, previous={"i-stopping": {"serial": 0, "replicas": []}})
    assert bus.agent_instances() == ["i-stopping"]


def test_a_gang_peer_on_a_host_whose_clock_is_behind_is_not_lost(tmp_path):
    """Each rank's agent judges its peers' agents (GangPeerLost stops the whole gang: a training run killed): a peer
    whose host clock is behind looked lost while it beat. A peer whose report stopped being written is lost still."""
    bus = Bus(backend_for(tmp_path))
    _skewed(bus, "i-b", BEHIND, running=["j/1"])
    _skewed(bus, "i-c", 3600.0, running=["j/2"])
    peers = [{"replica": 1, "instance": "i-b"}, {"replica": 2, "instance": "i-c"}]
    assert peer_lost(0, "i-a", peers[:1], bus.agent, now_unix(), stale_seconds()) is None
    report_written_ago(tmp_path, "i-c", 120)
    lost = peer_lost(0, "i-a", peers, bus.agent, now_unix(), stale_seconds())
    assert lost is not None and "replica 2's agent on i-c is lost" in lost, lost
