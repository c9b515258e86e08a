"""Black-box red team (s36): an outsider's scenarios through the CLI on the simulated cloud, each checked from the plan
JSON and the sim's own record, not from the planner's view of itself. What held is listed in the branch's report."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.fleetkit import copy_quickstart
from tests.test_safety import cli_here


@pytest.fixture(scope="module")
def applied_once(tmp_path_factory) -> Path:
    """The quickstart applied once for the module on the sim: tests copy it, never change it."""
    cfg = copy_quickstart(tmp_path_factory.mktemp("applied"))
    res = cli_here("apply", cfg, "--auto-approve")
    assert res.returncode == 0, res.stderr
    return cfg


@pytest.fixture
def applied(applied_once, tmp_path) -> Path:
    cfg = tmp_path / "quickstart"
    shutil.copytree(applied_once, cfg)
    return cfg


def _plan(cfg: Path) -> dict:
    res = cli_here("plan", cfg, "--format", "json", "--no-memo")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.parametrize("edit", [("pools.yaml", "max_instances: 3", "max_instances: 1"),
                                  ("policies.yaml", "max_hourly_budget: 150", "max_hourly_budget: 40")], ids=["max_instances", "budget"])
def test_a_move_off_spot_to_dearer_on_demand_is_not_said_to_be_for_cost(applied, edit):
    """aws-a100's max_instances lowered below the 2 instances llm-pretrain's gang runs on (or the budget below what the
    fleet costs): the gang stops, and with its 16 on-demand GPUs gone the fleet would be 90% spot, so ablation-attn
    leaves its $2.00/h spot g5.12xlarge for a new $5.67/h on-demand one. Its reason said "consolidation: its instance is
    removed" and its old instance's delete "consolidated: its replicas fit more cheaply elsewhere" (under the budget:
    "leaves ...: the fleet costs $53.40/h, over max_hourly_budget $40.00/h"): a saving claimed for a move that costs
    $3.67/h more."""
    name, old, new = edit
    (applied / name).write_text((applied / name).read_text().replace(old, new, 1))
    plan = _plan(applied)
    move = next(j for j in plan["jobs"] if j["job"] == "ablation-attn")
    assert move["action"] == "move", move
    (left,) = move["previous"]
    (came,) = move["instances"]
    old = next(d for d in plan["deletes"] if d["instance_id"] == left)
    new = next(c for c in plan["creates"] if c["ref"] == came)
    assert (old["market"], new["market"]) == ("spot", "on-demand") and new["price"] > old["price"], (old, new)
    assert "consolidat" not in move["reason"] and "max_hourly_budget" not in move["reason"], move["reason"]
    assert "more cheaply" not in old["reason"], old["reason"]
    assert "max_spot_fraction" in move["reason"], move["reason"]  # the rule that moves it, named


def test_an_instance_without_the_fleets_uid_launched_after_it_had_one_is_not_deleted(applied):
    """Someone launches an instance tagged with the fleet's name, a pool and a create key (another tool's template, or
    tags copied by hand), but not the fleet's uid. Uid-less instances are taken as launched before uids existed, so it was
    the fleet's, idle, and the plan deleted it as "no longer needed". Every launch since this fleet had a uid carries it,
    so one launched after the fleet's first uid-tagged instance is no launch of this fleet: left alone, with a note."""
    from datetime import datetime, timedelta

    from providers.sim import SimCloud

    sim = SimCloud(applied / ".reconcile")
    last = max(datetime.fromisoformat(i["launched_at"]) for i in sim.instances())
    stray = sim.plant("aws", "us-east-1", "us-east-1a", "m6i.4xlarge",
                      {"fleetops.io/fleet": "quickstart", "fleetops.io/pool": "aws-cpu", "fleetops.io/create-key": "abcdef012345-0001"})
    with sim.world() as w:
        w["instances"][stray]["launched_at"] = (last + timedelta(minutes=5)).isoformat()
    plan = _plan(applied)
    assert stray not in {d["instance_id"] for d in plan["deletes"]}, plan["deletes"]
    assert any(n.startswith(stray) for n in plan["notes"]), plan["notes"]
    assert cli_here("apply", applied, "--auto-approve").returncode == 0
    assert {i["id"]: i["state"] for i in sim.instances()}[stray] == "running"


# -- s37: the imperative shell around a plan (saved plans, state, locks, the controller) ---------------------------------

def _swap_in_state(cfg: Path, a: str, b: str) -> None:
    """Edit .reconcile/state.json as a pull request could commit it: jobs a and b swap instances, at the serial the
    apply that placed them wrote (the instances' tags still say where each runs)."""
    path = cfg / ".reconcile" / "state.json"
    state = json.loads(path.read_text())
    p = state["placements"]
    p[a], p[b] = p[b], p[a]
    path.write_text(json.dumps(state, indent=1))


def _hosts(cfg: Path) -> dict[str, list[str]]:
    """What each instance's published assignment tells its agent to run (what really runs there)."""
    return {f.stem: sorted(r["job"] for r in json.loads(f.read_text())["replicas"])
            for f in sorted((cfg / ".reconcile" / "assignments").glob("*.json"))}


def test_a_tags_note_says_newer_state_only_where_the_state_is_newer(applied):
    """A state whose placements disagree with an instance's tags of the same serial (one apply wrote both, so one was
    edited since) was noted as "the newer state (serial 1)" beside "its tags (serial 1)": a claim the two serials
    printed next to it deny."""
    _swap_in_state(applied, "finetune-a", "finetune-b")
    plan = _plan(applied)
    said = [n for n in plan["notes"] if n.startswith(("sim-gcp-00007:", "sim-gcp-00008:"))]
    assert len(said) == 2, plan["notes"]
    assert not any("newer state" in n for n in said), said


@pytest.mark.parametrize("later", [False, True], ids=["at-the-tags-serial", "after-a-later-apply"])
def test_a_state_that_swaps_two_replicas_against_their_tags_restarts_nothing_unsaid(applied, later):
    """finetune-a runs on sim-gcp-00007 and finetune-b on sim-gcp-00008 (two a2-highgpu-1g spot instances), as the
    instances' placement tags and the published assignments say, written by the same apply as the state. A state.json
    with the two swapped (committed in a PR where the state is local: `.reconcile/` is only gitignored) at that same
    serial is believed over the tags: the plan says "No changes ... 0 moved, 10 unchanged", and apply publishes
    finetune-b to sim-gcp-00007 and finetune-a to sim-gcp-00008, stopping both running jobs and restarting each on the
    other's instance (work since the last checkpoint lost). One apply writes tags and state with one serial, so at equal
    serials a disagreement means one of them was edited: what runs is what the agents report, else the tags (the
    cloud's record, which no pull request edits) win, said in a note per instance; the apply moves nothing and puts the
    state right. After a later apply that changed nothing there (the state's serial past the tags', which an apply
    rewrites only where they differ), the tags and the instance's published assignment, which agree, win likewise."""
    if later:
        assert cli_here("apply", applied, "--auto-approve").returncode == 0
    path = applied / ".reconcile" / "state.json"
    placed = json.loads(path.read_text())["placements"]
    before = _hosts(applied)
    assert before["sim-gcp-00007"] == ["finetune-a"] and before["sim-gcp-00008"] == ["finetune-b"], before
    _swap_in_state(applied, "finetune-a", "finetune-b")
    plan = _plan(applied)
    assert not any(j["action"] != "keep" for j in plan["jobs"]), [(j["job"], j["action"]) for j in plan["jobs"]]
    said = [n for n in plan["notes"] if n.startswith(("sim-gcp-00007:", "sim-gcp-00008:"))]
    serial = json.loads(path.read_text())["serial"]
    assert (len(said) == 2 and all(f"serial {serial}) disagrees with its tags (serial 1)" in n if later else "disagree at serial 1" in n
                                   for n in said) and all("the tags win" in n for n in said)), plan["notes"]
    res = cli_here("apply", applied, "--auto-approve")
    assert res.returncode == 0, res.stderr
    assert _hosts(applied) == before, (_hosts(applied), res.stdout[-400:])
    assert json.loads(path.read_text())["placements"] == placed  # the state agrees with the tags again


def test_unlock_refuses_a_lock_a_running_apply_holds(applied):
    """The refusal a second apply gets says "if no apply is running, run `reconcile unlock ID`", and unlock is for a
    stale lock; yet `reconcile unlock` broke the lock of an apply running on this host ("lock ... broken", exit 0), and
    the next apply ran beside it: the first stops only before its next provider call, its actions in flight go on while
    the second observes and launches for the same work (on a real cloud, before they are listed). The holder keeps its
    lock file flock()ed while it runs (the kernel drops that when it dies, which is how a dead holder's lock is taken
    over), so a held flock is a live apply, not a guess: refused, naming it and how to stop it."""
    from reconciler.state import ApplyLock

    with ApplyLock(applied) as held:  # an apply in progress, as its lock and flock show it
        res = cli_here("unlock", held.id, "--dir", applied)
        assert res.returncode == 1, (res.stdout, res.stderr)
        assert "Traceback" not in res.stderr and f"pid {os.getpid()}" in res.stderr and "running" in res.stderr, res.stderr
        assert held.still_held()
    res = cli_here("unlock", held.id, "--dir", applied)  # released: nothing left to break
    assert res.returncode == 1 and "no lock is held" in res.stderr, res.stderr
