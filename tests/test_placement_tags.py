"""Issue 4: instances carry the job replicas they host as tags, and observe recovers placements from them.

The tag format (literal values, chunking, overflow), the merge rules of state and tags, then the same
scenario on the sim and on a real moto server over HTTP (apply, a consolidation move onto an existing
instance, an eviction, the state file deleted), each step checked by a client independent of the
provider: the sim's world file, a separate boto3 client, the AWS CLI. Crashes between the cloud and
the state write, stale tags, long lists and instances the fleet does not own are covered too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Callable

import boto3
import pytest
from typer.testing import CliRunner

from providers.aws import AwsProvider
from providers.base import (TAG_CREATE_KEY, TAG_FLEET, TAG_FLEET_UID, TAG_MIG, TAG_RESERVATION, CreateRequest, PoolTarget, ProviderContext,
                            ownership_tags)
from providers.placements import (MAX_TAGS, SERIAL_MAX, TAG_PLACEMENTS, TAG_PLACEMENTS_SERIAL, TAG_VALUE_MAX, Placement, PlacementRecord,
                                  PlacementTagError, placement_tags, read_placements)
from providers.sim import SimCloud, SimProvider
from reconciler import api
from reconciler.cli import app
from reconciler.errors import OwnershipError, ReconcileError
from reconciler.placements import merge_placements, untrusted_gpus
from reconciler.plan import Plan
from reconciler.render import render
from reconciler.state import State, state_dir
from tests.conftest import AWS_ENV
from tests.fleetkit import instance, job, pool, tenant, topology, write_config

AMI = "ami-03cf127a"  # one of moto's built-in images


# ---------------------------------------------------------------- the format


def test_tags_are_readable_and_round_trip():
    rec = PlacementRecord.of(12, [Placement("train", 1, (4, 5, 6, 7)), Placement("etl", 0), Placement("train", 0, (0, 1, 2, 3)),
                                  Placement("x", 2, (0, 1, 4, 5, 7))])
    tags = placement_tags(rec)
    assert tags == {TAG_PLACEMENTS: "etl/0,train/0@0-3,train/1@4-7,x/2@0-1+4-5+7", TAG_PLACEMENTS_SERIAL: "12"}
    assert read_placements(tags) == rec
    empty = placement_tags(PlacementRecord(3))
    assert empty == {TAG_PLACEMENTS: "", TAG_PLACEMENTS_SERIAL: "3"}  # known empty, not "not recorded"
    assert read_placements(empty) == PlacementRecord(3) and read_placements({"Name": "x"}) is None


def test_long_lists_chunk_at_entry_boundaries_and_a_stale_chunk_is_never_read():
    rec = PlacementRecord.of(7, [Placement(f"sweep-learning-rate-{i:03d}", i % 3, (i % 8,)) for i in range(90)])
    tags = placement_tags(rec)
    chunks = [k for k in tags if k != TAG_PLACEMENTS_SERIAL]
    assert chunks == [TAG_PLACEMENTS] + [f"{TAG_PLACEMENTS}-{n}" for n in range(2, len(chunks) + 1)] and 1 < len(chunks) <= MAX_TAGS
    assert all(len(v) <= TAG_VALUE_MAX for v in tags.values())
    assert all(tags[k].endswith(",...") for k in chunks[:-1]) and not tags[chunks[-1]].endswith(",...")
    assert read_placements(tags) == rec
    # An interrupted rewrite to a shorter list may leave a higher chunk behind: the last chunk says it is the last.
    short = placement_tags(PlacementRecord.of(8, [Placement("a", 0)]))
    assert read_placements({**tags, **short}) == PlacementRecord.of(8, [Placement("a", 0)])


def test_more_than_the_tags_can_hold_is_marked_not_written_in_part():
    rec = PlacementRecord.of(4, [Placement(f"cpu-worker-with-a-long-name-{i:04d}", 0) for i in range(300)])
    tags = placement_tags(rec)
    assert tags == {TAG_PLACEMENTS: "!overflow 300", TAG_PLACEMENTS_SERIAL: "4"}
    assert read_placements(tags) == PlacementRecord(4, (), complete=False)


@pytest.mark.parametrize("tags", [
    {TAG_PLACEMENTS: "a/0"},  # no serial
    {TAG_PLACEMENTS: "a/0", TAG_PLACEMENTS_SERIAL: "x"},
    {TAG_PLACEMENTS: "a/zero", TAG_PLACEMENTS_SERIAL: "1"},
    {TAG_PLACEMENTS: "a/0@", TAG_PLACEMENTS_SERIAL: "1"},
    {TAG_PLACEMENTS: "a/0@1-x", TAG_PLACEMENTS_SERIAL: "1"},
    {TAG_PLACEMENTS: "a/0,...", TAG_PLACEMENTS_SERIAL: "1"},  # continued, but no -2
    # Never written by placement_tags: a run backwards (was read as no GPUs), a GPU twice (was taken as two), a run
    # of 10^11 GPUs (was a list of 10^11 ints), and digits int() refuses (was an uncaught ValueError).
    {TAG_PLACEMENTS: "a/0@3-1", TAG_PLACEMENTS_SERIAL: "1"},
    {TAG_PLACEMENTS: "a/0@0+0", TAG_PLACEMENTS_SERIAL: "1"},
    {TAG_PLACEMENTS: "a/0@0-1+1-2", TAG_PLACEMENTS_SERIAL: "1"},
    {TAG_PLACEMENTS: "a/0@0-99999999999", TAG_PLACEMENTS_SERIAL: "1"},
    {TAG_PLACEMENTS: "a/0@\u00b2", TAG_PLACEMENTS_SERIAL: "1"},
    {TAG_PLACEMENTS: "a/\u00b2", TAG_PLACEMENTS_SERIAL: "1"},
    {TAG_PLACEMENTS: "a/0", TAG_PLACEMENTS_SERIAL: "\u00b2"},
    # A serial past the state's 64-bit counter (reconciler/state.py): the next apply saved a state one more, which
    # its next load refuses as corrupt.
    {TAG_PLACEMENTS: "a/0", TAG_PLACEMENTS_SERIAL: str(2**63)},
    {TAG_PLACEMENTS: "a/0", TAG_PLACEMENTS_SERIAL: "9" * 250},
])
def test_unreadable_tags_are_a_typed_error(tags):
    with pytest.raises(PlacementTagError):
        read_placements(tags)


# ---------------------------------------------------------------- state vs tags


def _tagged(iid: str, serial: int, *ps: Placement, **extra: str):
    inst = instance(iid, "p", "aws", "us-east-1", "us-east-1a", "g5.12xlarge")
    return inst.__class__(**{**inst.__dict__, "tags": {**inst.tags, **placement_tags(PlacementRecord.of(serial, ps)), **extra}})


def test_the_newer_record_wins_per_instance_and_per_replica_and_says_so():
    jobs = {"x", "y", "z"}
    state = State(placements={"x": ["i-a"], "y": ["i-b"], "z": ["i-gone"]}, gpus={"x": [[0, 1]]}, serial=5)
    # i-a: its tags are older and disagree: the state wins. i-b: its tags are newer (an apply that did not save its
    # state moved y off it, onto the new i-c, and x's replica 0 there too): the tags win, replica by replica.
    insts = [_tagged("i-a", 4), _tagged("i-b", 6), _tagged("i-c", 6, Placement("y", 0, (2, 3)), Placement("z", 0))]
    m = merge_placements(state, insts, jobs)
    assert m.placements == {"x": ("i-a",), "y": ("i-c",), "z": ("i-c",)}
    assert m.lost == {} and m.serial == 6  # z's state claim on a gone instance is superseded, not lost
    assert m.gpu_indices == {"x": ((0, 1),), "y": ((2, 3),)}
    assert any("i-a" in n and "the state wins" in n for n in m.notes)
    assert any("i-b" in n and "the tags win" in n for n in m.notes) and any("i-c" in n and "the tags win" in n for n in m.notes)


def test_a_replica_two_instances_claim_at_one_serial_is_the_first_launched_ones():
    """Damage audit: an instance cloned in the console with all its tags (or launched from an image of it) claims the
    same replicas at the same serial. With the state lost, the higher instance id won: the plan took the clone as the
    host and deleted the original, the one actually running the work, as idle ("10 unchanged"). Two claims at one serial
    come from a copy, and a copy is launched after its original: the first launched wins, said in a note."""
    from dataclasses import replace

    p = Placement("x", 0, (0,))
    original = replace(_tagged("i-b", 7, p), launched_at="2026-11-30T10:00:00+00:00")
    clone = replace(_tagged("i-c", 7, p), launched_at="2026-12-01T09:00:00+00:00")
    for insts in ([original, clone], [clone, original]):
        m = merge_placements(State(), insts, {"x"})
        assert m.placements == {"x": ("i-b",)}, m.placements
        assert any("i-b" in n and "i-c" in n and "launched first" in n for n in m.notes), m.notes
    # (unknown launch times: as before, by id)
    m = merge_placements(State(), [_tagged("i-b", 7, p), _tagged("i-c", 7, p)], {"x"})
    assert m.placements == {"x": ("i-c",)}


def test_a_claim_newer_than_any_apply_began_takes_no_replica_from_the_live_instance_holding_it():
    """Damage audit: an instance of the fleet's (one anyone who can tag in the account tagged) with placement tags at
    serial state+1000 claiming x/0: the newer claim won, so x "ran" there, its real host i-a looked idle and the plan
    deleted it ("no longer needed"). Each apply records the serial it began with (`started`) before it touches the
    cloud, so newer tags past it were written by something else: they take no replica a live instance holds."""
    p = Placement("x", 0, (0, 1))
    state = State(placements={"x": ["i-a"]}, gpus={"x": [[0, 1]]}, serial=5, started=5)
    m = merge_placements(state, [_tagged("i-a", 5, p), _tagged("i-z", 1005, p)], {"x"})
    assert m.placements == {"x": ("i-a",)} and m.gpu_indices == {"x": ((0, 1),)}
    assert any(n.startswith("x/0 is claimed by the tags of i-z (serial 1005), newer than any apply began (5)") for n in m.notes), m.notes
    # Its real host gone, the claim is all there is (a replacement launched by hand is better than none).
    assert merge_placements(state, [_tagged("i-z", 1005, p)], {"x"}).placements == {"x": ("i-z",)}
    # Applies that began at 6 and 7 (two crashes before the state was saved): their claims win where i-a's tags agree
    # that x left it. Not retagged (the apply died after its creates, before it retagged the instances it kept), x still
    # runs on i-a (an apply publishes after it saves the state): it stays there.
    state = State(placements={"x": ["i-a"]}, gpus={"x": [[0, 1]]}, serial=5, started=7)
    m = merge_placements(state, [_tagged("i-a", 7), _tagged("i-b", 7, p)], {"x"})
    assert m.placements == {"x": ("i-b",)} and m.serial == 7
    m = merge_placements(state, [_tagged("i-a", 5, p), _tagged("i-b", 7, p)], {"x"})
    assert m.placements == {"x": ("i-a",)} and m.serial == 7
    assert any(n.startswith("x/0 is claimed by the tags of i-b (serial 7), but i-a, which runs and which the state places "
                            "it on, does not say it left") for n in m.notes), m.notes
    # A state saved before `started` was recorded: one interrupted apply past its serial is believed, no more.
    state = State(placements={"x": ["i-a"]}, gpus={"x": [[0, 1]]}, serial=5)
    assert merge_placements(state, [_tagged("i-a", 6), _tagged("i-b", 6, p)], {"x"}).placements == {"x": ("i-b",)}
    assert merge_placements(state, [_tagged("i-a", 5, p), _tagged("i-b", 7, p)], {"x"}).placements == {"x": ("i-a",)}
    # An older copy of the state: the applies since retagged i-a (x moved off it), so i-b's claim holds at any serial.
    assert merge_placements(state, [_tagged("i-a", 9), _tagged("i-b", 9, p)], {"x"}).placements == {"x": ("i-b",)}


def test_at_the_states_own_serial_what_runs_decides_else_the_tags_and_one_instances_tags_alone_move_nothing():
    """One apply writes the state and the tags with one serial, so at that serial a disagreement is an edit. A state
    with x and y swapped (a state.json committed in a pull request) was believed: apply moved both, restarting them,
    under "No changes". The agents' reports of what runs decide; without them the tags (the cloud's record) win, but a
    replica leaves the live instance the state places it on only where that instance's own tags drop it too."""
    x, y = Placement("x", 0, (0, 1)), Placement("y", 0, (2, 3))
    swapped = State(placements={"x": ["i-b"], "y": ["i-a"]}, gpus={"x": [[0, 1]], "y": [[2, 3]]}, serial=5, started=5)
    tags = [_tagged("i-a", 5, x), _tagged("i-b", 5, y)]
    m = merge_placements(swapped, tags, {"x", "y"})
    assert m.placements == {"x": ("i-a",), "y": ("i-b",)} and m.gpu_indices == {"x": ((0, 1),), "y": ((2, 3),)}
    assert [n.split(":")[0] for n in m.notes] == ["i-a", "i-b"], m.notes
    assert all("disagree at serial 5" in n and "the tags win" in n for n in m.notes), m.notes
    # What the agents report running decides over both (here: the state was right, the tags were edited).
    swapped.running = lambda: {"i-a": frozenset({"y/0"}), "i-b": frozenset({"x/0"})}
    assert merge_placements(swapped, tags, {"x", "y"}).placements == {"x": ("i-b",), "y": ("i-a",)}
    # A forged "hosts nothing" (or another's job) on the real host at the state's serial moves nothing off it.
    state = State(placements={"x": ["i-a"], "y": ["i-b"]}, gpus={"x": [[0, 1]], "y": [[2, 3]]}, serial=5, started=5)
    for forged in (_tagged("i-a", 5), _tagged("i-a", 5, y)):
        m = merge_placements(state, [forged, _tagged("i-b", 5, y)], {"x", "y"})
        assert m.placements == {"x": ("i-a",), "y": ("i-b",)}, (forged.tags, m.notes)
        (said,) = [n for n in m.notes if n.startswith("i-a: the state and its tags disagree at serial 5")]
        assert "x/0, which no other instance's tags claim, stays on it" in said and "tags win" not in said, said
    # Older tags (an apply rewrites only those that differ) against a newer state: the state wins, unless the instance's
    # published assignment lists what its tags do (two records of its last apply against one edited since). A tag write
    # that failed as an apply moved x to i-b leaves i-a's old tags, but its assignment was published without x.
    moved = State(placements={"x": ["i-b"]}, gpus={"x": [[0, 1]]}, serial=6, started=6,
                  assigned=lambda: {"i-a": frozenset(), "i-b": frozenset({"x/0"})})
    assert merge_placements(moved, [_tagged("i-a", 5, x), _tagged("i-b", 6, x)], {"x"}).placements == {"x": ("i-b",)}
    swapped.serial, swapped.started, swapped.running = 6, 6, None
    assert merge_placements(swapped, tags, {"x", "y"}).placements == {"x": ("i-b",), "y": ("i-a",)}  # no second record
    swapped.assigned = lambda: {"i-a": frozenset({"x/0"}), "i-b": frozenset({"y/0"})}
    assert merge_placements(swapped, tags, {"x", "y"}).placements == {"x": ("i-a",), "y": ("i-b",)}
    swapped.serial = swapped.started = 5
    # Tags at the state's serial that hold more than tags can are not read: the state says what the instance hosts.
    over = _tagged("i-a", 5, **{TAG_PLACEMENTS: "!overflow 400"})
    assert merge_placements(swapped, [over, _tagged("i-b", 5, y)], {"x", "y"}).placements == {"x": ("i-b",), "y": ("i-a",)}


def _says_it_stays(notes, iid: str, replica: str) -> bool:
    """A note says the state keeps `replica` on `iid` over its tags: past every apply begun, the instance's tags at
    once; else the replica they drop that no other instance's tags claim."""
    return any(n.startswith(f"{iid}: its tags") and (("no apply wrote them" in n and "the state says what it hosts" in n) or
               (", but for " in n and replica in n.split(", but for ")[1] and n.endswith("left on it"))) for n in notes)


def test_one_instances_tags_alone_never_take_a_replica_off_the_live_instance_the_state_places_it_on():
    """Damage audit: tags on the real host i-a at a serial past the state's, saying it hosts nothing (or other jobs),
    were believed: x "ran" nowhere, i-a looked idle and the plan deleted it, or moved x. With no record of the applies
    begun (the first apply after the upgrade), at the state's serial + 1 they read as an apply that died; with one, at
    any serial. An apply that moves a replica retags both ends at one serial (the new host at launch or retag, the old
    one after), and one that died before saving the state published nothing, so the replica still runs where the state
    says: it moves off a live instance only when that instance's tags and another's, each at a serial an apply can have
    written, agree that it did. Each record that is not believed says so in a note."""
    p = Placement("x", 0, (0, 1))
    y = Placement("y", 0, (2, 3))
    for started in (None, 5):
        for serial in (6, 1005):
            state = State(placements={"x": ["i-a"], "y": ["i-b"]}, gpus={"x": [[0, 1]], "y": [[2, 3]]}, serial=5, started=started)
            for forged in (_tagged("i-a", serial), _tagged("i-a", serial, y)):  # hosts nothing; hosts y, not x
                m = merge_placements(state, [forged, _tagged("i-b", 5, y)], {"x", "y"})
                assert m.placements == {"x": ("i-a",), "y": ("i-b",)}, (started, serial, forged.tags)
                assert m.gpu_indices == {"x": ((0, 1),), "y": ((2, 3),)}
                assert _says_it_stays(m.notes, "i-a", "x/0"), m.notes
    state = State(placements={"x": ["i-a"]}, gpus={"x": [[0, 1]]}, serial=5)
    # Both ends agree at a serial an apply can have written (one that died): moved.
    assert merge_placements(state, [_tagged("i-a", 6), _tagged("i-b", 6, p)], {"x"}).placements == {"x": ("i-b",)}
    # Past every apply begun, two forged tags agree in vain, and the instance's own say nothing of the GPUs it gives x.
    state.started = 5
    m = merge_placements(state, [_tagged("i-a", 1005), _tagged("i-z", 1005, p)], {"x"})
    assert m.placements == {"x": ("i-a",)}, m.notes
    m = merge_placements(state, [_tagged("i-a", 1005, Placement("x", 0, (2, 3)))], {"x"})
    assert m.placements == {"x": ("i-a",)} and m.gpu_indices == {"x": ((0, 1),)}


def test_tags_of_applies_that_published_are_believed_over_a_state_and_a_record_put_back_from_older_copies():
    """The state and started.json put back together from an older copy (serial 5), the applies since moved x to i-b and
    published it (through serial 7: what the agents report running, and the assignments). Judged by the record alone,
    their tags were past every apply begun: x stayed on i-a and i-b, running it, looked idle. With i-a's retag failed
    too (its tags still say x, at 5), i-b's claim took nothing even before. What was published bounds the applies as
    started.json does, and tags up to it are an apply's that finished: they say where the work runs."""
    p = Placement("x", 0, (0, 1))
    state = State(placements={"x": ["i-a"]}, gpus={"x": [[0, 1]]}, serial=5, started=5, published=lambda: 7)
    assert merge_placements(state, [_tagged("i-a", 7), _tagged("i-b", 7, p)], {"x"}).placements == {"x": ("i-b",)}
    assert merge_placements(state, [_tagged("i-a", 5, p), _tagged("i-b", 7, p)], {"x"}).placements == {"x": ("i-b",)}
    # Not published (the apply died before it saved the state): x runs on i-a still, whose tags were not rewritten.
    state.started, state.published = 7, (lambda: 5)
    assert merge_placements(state, [_tagged("i-a", 5, p), _tagged("i-b", 7, p)], {"x"}).placements == {"x": ("i-a",)}
    # Past what was published, tags are still no apply's.
    state.started, state.published = 5, (lambda: 7)
    assert merge_placements(state, [_tagged("i-a", 1005), _tagged("i-b", 1005, p)], {"x"}).placements == {"x": ("i-a",)}

    def unasked() -> int:
        raise AssertionError("the bus is read only when tags are newer than the state")

    state.published = unasked
    assert merge_placements(state, [_tagged("i-a", 5, p)], {"x"}).placements == {"x": ("i-a",)}


def test_without_a_state_placements_come_from_the_tags():
    insts = [_tagged("i-a", 9, Placement("g", 0, (0, 1, 2, 3)), Placement("h", 0)), _tagged("i-b", 3, Placement("g", 1, (4, 5, 6, 7)))]
    m = merge_placements(State(), insts, {"g", "h"})
    assert m.placements == {"g": ("i-a", "i-b"), "h": ("i-a",)}
    assert m.gpu_indices == {"g": ((0, 1, 2, 3), (4, 5, 6, 7))} and m.serial == 9
    assert m.notes == ("the state records no placements: 3 replica(s) on 2 instance(s) recovered from their fleetops.io/placements tags",)


def test_overflowed_or_unreadable_tags_leave_the_instance_to_the_state():
    state = State(placements={"x": ["i-a"], "y": ["i-b"]}, serial=2)
    over = _tagged("i-a", 3, **{TAG_PLACEMENTS: "!overflow 400"})
    bad = _tagged("i-b", 3, **{TAG_PLACEMENTS: "y/0@oops"})
    m = merge_placements(state, [over, bad], {"x", "y"})
    assert m.placements == {"x": ("i-a",), "y": ("i-b",)}
    assert any("i-a" in n and "more replicas than tags can" in n for n in m.notes)
    assert any("i-b" in n and "cannot be read" in n for n in m.notes)


def test_gpu_indices_no_apply_could_give_are_dropped_with_a_note():
    """GPU indices past the instance's GPUs, or held by two replicas of one instance, are an edited state or edited
    tags: trusted, apply wrote them on to the agent and back into the tags (`finetune-a/0@99`). Each such job's are
    dropped with a note (its replicas get GPUs anew, as a job with none recorded); the others' are kept."""
    state = State(placements={"a": ["i-a"], "b": ["i-a"], "c": ["i-b"], "d": ["i-b"], "e": ["i-b"], "f": ["i-x"]},
                  gpus={"a": [[0, 1]], "b": [[2, 3]], "c": [[0]], "d": [[0, 1]], "e": [[2, 3]], "f": [[99]]}, serial=3)
    insts = [_tagged("i-a", 3), _tagged("i-b", 3), _tagged("i-x", 3)]  # g5.12xlarge: 4 GPUs
    insts = [*insts[:2], insts[2].__class__(**{**insts[2].__dict__, "instance_type": "unknown.type"})]
    gpus = {"g5.12xlarge": 4}
    m = untrusted_gpus(merge_placements(state, insts, set(state.placements)), insts, lambda i: gpus.get(i.instance_type))
    assert m.gpu_indices == {"a": ((0, 1),), "b": ((2, 3),), "e": ((2, 3),), "f": ((99,),)}  # f: its type is unknown
    assert [n for n in m.notes if "not trusted" in n] == [
        "job c: its recorded GPU indices are not trusted (GPU 0 of i-b is recorded for c and d); the plan gives its replicas GPUs anew",
        "job d: its recorded GPU indices are not trusted (GPU 0 of i-b is recorded for c and d); the plan gives its replicas GPUs anew"]
    state.gpus["a"] = [[0, 4]]
    m = untrusted_gpus(merge_placements(state, insts, set(state.placements)), insts, lambda i: gpus.get(i.instance_type))
    assert "a" not in m.gpu_indices and "b" in m.gpu_indices
    assert any(n.startswith("job a: its recorded GPU indices are not trusted (replica 0 on i-a is recorded on GPU(s) [0, 4], "
                            "but its g5.12xlarge has 4 GPU(s) (0..3))") for n in m.notes), m.notes


# ---------------------------------------------------------------- one scenario, sim and AWS


def _docs(fleet: str, jobs: list[dict], hi: int, aws: bool) -> list[dict]:
    p = pool("p", "aws", "us-east-1", ["us-east-1a"], ["g5.12xlarge"], hi=hi)
    if aws:
        p["spec"]["aws"] = {"ami": AMI}
    return [topology(fleet, clouds={"aws": {"us-east-1": ["us-east-1a"]}}), tenant("t"), p, *jobs]


def _gpu_job(name: str, **spec) -> dict:
    return job(name, gpus=2, gpu_type="A10G", cpu=8, mem=32, **spec)


def _expected(cfg: Path) -> dict[str, set[Placement]]:
    """What each instance hosts according to the saved state."""
    st = json.loads((state_dir(cfg) / "state.json").read_text())
    out: dict[str, set[Placement]] = {}
    for j, ids in st["placements"].items():
        for r, iid in enumerate(ids):
            out.setdefault(iid, set()).add(Placement(j, r, tuple(st["gpus"][j][r]) if j in st["gpus"] else ()))
    return out


def _run_scenario(cfg: Path, fleet: str, provider: str, options: dict, tags_of: Callable[[], dict[str, dict]], aws: bool):
    """`tags_of()`: this fleet's live instances -> their tags, read without the provider."""
    def check() -> dict[str, dict]:
        seen = tags_of()
        want = _expected(cfg)
        assert set(want) <= set(seen)
        for iid, tags in seen.items():
            rec = read_placements(tags)
            assert rec is not None and set(rec.placements) == want.get(iid, set()), iid
        return seen

    run = dict(provider=provider, options=options, time_limit=5)
    write_config(cfg, _docs(fleet, [_gpu_job("a"), _gpu_job("b", priority="low"), _gpu_job("c")], 3, aws))
    assert api.apply(cfg, **run).report.ok
    first = check()
    assert len(first) == 2 and sum(len(read_placements(t).placements) for t in first.values()) == 3

    # a finishes: the replica left alone on its instance moves onto the other one (consolidation), which is retagged.
    write_config(cfg, _docs(fleet, [_gpu_job("b", priority="low"), _gpu_job("c")], 3, aws))
    res = api.apply(cfg, **run)
    moved = [j for j in res.plan.jobs if j.action == "move"]
    assert res.report.ok and len(moved) == 1 and len(res.report.deleted) == 1
    second = check()
    (kept,) = second
    assert {p.job for p in read_placements(second[kept]).placements} == {"b", "c"}
    assert read_placements(second[kept]).serial > read_placements(first[kept]).serial

    # One instance at most, and a critical job arrives: b (low) is evicted, the instance's tags lose it.
    write_config(cfg, _docs(fleet, [_gpu_job("b", priority="low"), _gpu_job("c"), _gpu_job("urgent", priority="critical")], 1, aws))
    res = api.apply(cfg, **run)
    assert res.report.ok and {j.job: j.action for j in res.plan.jobs}["b"] == "evict" and not res.plan.creates
    third = check()
    assert {p.job for p in read_placements(third[kept]).placements} == {"c", "urgent"}

    # The state file is lost (a fresh CI runner): the placements come back from the tags, nothing to change.
    before = api.plan(cfg, **run)
    (state_dir(cfg) / "state.json").unlink()
    after = api.plan(cfg, **run)
    assert not after.plan.has_changes
    assert after.observed.placements == before.observed.placements and after.observed.gpu_indices == before.observed.gpu_indices
    assert any("recovered from their fleetops.io/placements tags" in n for n in after.plan.notes)
    # An apply now saves a state newer than every tag; the next plan has nothing to say.
    assert api.apply(cfg, **run).report.ok and not api.plan(cfg, **run).plan.notes
    return kept


def _sim_tags(cfg: Path, fleet: str) -> Callable[[], dict[str, dict]]:
    def read() -> dict[str, dict]:
        return {i["id"]: i["tags"] for i in SimCloud(state_dir(cfg)).instances()
                if i["state"] == "running" and i["tags"].get(TAG_FLEET) == fleet}
    return read


def test_sim_records_placements_and_recovers_them_without_the_state(tmp_path):
    cfg = tmp_path / "cfg"
    kept = _run_scenario(cfg, "tags-sim", "sim", {}, _sim_tags(cfg, "tags-sim"), aws=False)
    listing = CliRunner().invoke(app, ["sim", "ls", "--dir", str(cfg)]).output.splitlines()
    assert [line.split("\t")[-1] for line in listing if line.startswith(kept)] == ["c/0,urgent/0"]


def test_aws_records_placements_and_recovers_them_without_the_state(aws_env, tmp_path):
    fleet = f"tags-{uuid.uuid4().hex[:8]}"  # moto's state is shared by the session
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=aws_env)

    def read() -> dict[str, dict]:
        resp = ec2.describe_instances(Filters=[{"Name": f"tag:{TAG_FLEET}", "Values": [fleet]},
                                               {"Name": "instance-state-name", "Values": ["pending", "running"]}])
        return {d["InstanceId"]: {t["Key"]: t["Value"] for t in d.get("Tags", [])} for r in resp["Reservations"] for d in r["Instances"]}

    cfg = tmp_path / "cfg"
    kept = _run_scenario(cfg, fleet, "aws", {"endpoint_url": aws_env}, read, aws=True)
    # What an operator sees with the AWS CLI.
    out = subprocess.run([str(Path(sys.executable).parent / "aws"), "ec2", "describe-tags", "--endpoint-url", aws_env,
                          "--region", "us-east-1", "--filters", f"Name=resource-id,Values={kept}", "--output", "json"],
                         capture_output=True, text=True, env={**os.environ, **AWS_ENV}, check=True)
    shown = {t["Key"]: t["Value"] for t in json.loads(out.stdout)["Tags"]}
    gpus = json.loads((state_dir(cfg) / "state.json").read_text())["gpus"]
    span = {j: f"{gpus[j][0][0]}-{gpus[j][0][1]}" for j in ("c", "urgent")}  # two adjacent GPUs each
    assert shown[TAG_PLACEMENTS] == f"c/0@{span['c']},urgent/0@{span['urgent']}"
    assert int(shown[TAG_PLACEMENTS_SERIAL]) >= 3


# ---------------------------------------------------------------- crashes and stale tags (sim)


def _apply_killed_in(step: str, cfg, monkeypatch) -> None:
    """An apply of cfg killed (KeyboardInterrupt, as a SIGINT's) when it reaches reconciler.apply's `step`:
    `_record_placements` is after the creates, `_update_state` before the state is saved."""
    def crash(*_a, **_k):
        raise KeyboardInterrupt(f"killed at {step}")

    monkeypatch.setattr(f"reconciler.apply.{step}", crash)
    with pytest.raises(KeyboardInterrupt):
        api.apply(cfg, time_limit=5)
    monkeypatch.undo()


def test_a_crash_after_the_creates_loses_no_placement(tmp_path, monkeypatch):
    """The new instance carries its replicas from launch: a crash before the state write moves nothing again."""
    cfg = tmp_path / "cfg"
    write_config(cfg, _docs("crash", [_gpu_job("a"), _gpu_job("b")], 3, aws=False))
    api.apply(cfg, time_limit=5)
    write_config(cfg, _docs("crash", [_gpu_job("a"), _gpu_job("b"), *(_gpu_job(f"n{i}") for i in range(3))], 3, aws=False))
    _apply_killed_in("_record_placements", cfg, monkeypatch)
    assert json.loads((state_dir(cfg) / "state.json").read_text())["serial"] == 1  # the state was not written
    nxt = api.plan(cfg, time_limit=5)
    assert not nxt.plan.has_changes, [(j.job, j.action) for j in nxt.plan.jobs]
    assert {j.job for j in nxt.plan.jobs if j.action == "keep"} == {"a", "b", "n0", "n1", "n2"}
    assert any("newer than the state" in n and "the tags win" in n for n in nxt.plan.notes)
    assert Plan.from_json(nxt.plan.to_json()).notes == nxt.plan.notes  # a saved plan keeps its notes
    assert f"> **Note:** {nxt.plan.notes[0]}" in render(nxt.plan, "markdown")


def test_a_copy_tagged_newer_than_the_state_moves_no_work_and_deletes_nothing(tmp_path):
    """The attack end to end: an instance given the fleet's tags (a create key of its own: a copy with the original's
    is left alone, tests/test_ownership.py) claims its replicas at the state's serial + 1000. The plan deleted the real
    host as idle; it keeps the work where the state says, through the next apply too."""
    cfg = tmp_path / "cfg"
    write_config(cfg, _docs("forged", [_gpu_job("a"), _gpu_job("b")], 3, aws=False))
    api.apply(cfg, time_limit=5)
    placed = json.loads((state_dir(cfg) / "state.json").read_text())
    sim = SimCloud(state_dir(cfg))
    (host,) = [i for i in sim.instances() if i["state"] == "running"]
    claimed = read_placements(host["tags"]).placements
    copy = sim.plant("aws", "us-east-1", "us-east-1a", "g5.12xlarge", {**host["tags"], TAG_CREATE_KEY: "k-forged",
                     **placement_tags(PlacementRecord.of(placed["serial"] + 1000, claimed))})
    res = api.plan(cfg, time_limit=5)
    assert res.observed.placements == {"a": (host["id"],), "b": (host["id"],)}
    assert host["id"] not in {d.instance_id for d in res.plan.deletes}
    assert any(n.startswith(f"a/0 is claimed by the tags of {copy} (serial {placed['serial'] + 1000}), newer than any apply")
               for n in res.plan.notes), res.plan.notes
    api.apply(cfg, time_limit=5)
    after = json.loads((state_dir(cfg) / "state.json").read_text())
    assert after["placements"] == placed["placements"]
    assert any(i["id"] == host["id"] and i["state"] == "running" for i in sim.instances())


@pytest.mark.parametrize("started", [False, True], ids=["no-record-of-applies-begun", "recorded"])
@pytest.mark.parametrize("lists", ["nothing", "the-other-hosts-job"])
def test_tags_on_the_real_host_saying_it_hosts_something_else_delete_nothing_and_move_no_work(tmp_path, started, lists):
    """The attack end to end: the real host's own placement tags rewritten past the state's serial (one past it without
    the record of the applies begun, the first apply after the upgrade; a thousand past it with one), saying it hosts
    nothing, or the job the other instance runs. The plan placed a and b again as if they ran nowhere, and with the
    other job listed, moved all three jobs (a and b onto the other instance, c onto theirs). It keeps them, and the
    next apply rewrites the tags."""
    cfg = tmp_path / "cfg"
    write_config(cfg, _docs("forged", [_gpu_job("a"), _gpu_job("b"), _gpu_job("c")], 3, aws=False))
    api.apply(cfg, time_limit=5)
    placed = json.loads((state_dir(cfg) / "state.json").read_text())
    if not started:
        (state_dir(cfg) / "started.json").unlink()
    sim = SimCloud(state_dir(cfg))
    host, other = placed["placements"]["a"][0], placed["placements"]["c"][0]
    assert placed["placements"]["b"] == [host] and other != host
    claims = read_placements({i["id"]: i["tags"] for i in sim.instances()}[other]).placements if lists != "nothing" else ()
    with sim.world() as w:
        w["instances"][host]["tags"].update(placement_tags(PlacementRecord.of(placed["serial"] + (1000 if started else 1), claims)))
    res = api.plan(cfg, time_limit=5)
    assert res.observed.placements == {j: tuple(ids) for j, ids in placed["placements"].items()}
    assert not res.plan.has_changes, [(j.job, j.action, j.instances) for j in res.plan.jobs]
    assert _says_it_stays(res.plan.notes, host, "a/0"), res.plan.notes
    api.apply(cfg, time_limit=5)
    assert json.loads((state_dir(cfg) / "state.json").read_text())["placements"] == placed["placements"]
    assert sorted(i["id"] for i in sim.instances() if i["state"] == "running") == sorted([host, other])
    assert {p.job for p in read_placements({i["id"]: i["tags"] for i in sim.instances()}[host]).placements} == {"a", "b"}


def test_an_eviction_by_an_apply_that_died_is_believed_on_the_record_of_the_applies_begun_alone(tmp_path, monkeypatch):
    """An apply that evicts b for a critical job retags the instance (c and urgent, not b) and dies before it saves the
    state. Its tags drop b, which no other instance's tags claim: believed because the backend records that an apply
    began at their serial. Without that record (an apply of a version before it) they are one instance's tags laying it
    out anew, as an edit would: disbelieved, the instance held b, c and urgent (more GPUs than it has) and the planner
    failed with an internal error; believed, an edit stopped b. Refused, naming what to do; done, the plan recovers."""
    cfg = tmp_path / "cfg"
    write_config(cfg, _docs("evict", [_gpu_job("b", priority="low"), _gpu_job("c")], 1, aws=False))
    api.apply(cfg, time_limit=5)
    write_config(cfg, _docs("evict", [_gpu_job("b", priority="low"), _gpu_job("c"), _gpu_job("urgent", priority="critical")], 1,
                            aws=False))
    _apply_killed_in("_update_state", cfg, monkeypatch)
    saved = json.loads((state_dir(cfg) / "state.json").read_text())
    assert saved["serial"] == 1 and set(saved["placements"]) == {"b", "c"}
    (host,) = [i for i in SimCloud(state_dir(cfg)).instances() if i["state"] == "running"]
    assert {p.job for p in read_placements(host["tags"]).placements} == {"c", "urgent"}

    def recovered() -> None:
        res = api.plan(cfg, time_limit=5)
        assert res.observed.placements == {"c": (host["id"],), "urgent": (host["id"],)}
        assert not res.plan.has_changes and {j.job: j.action for j in res.plan.jobs}["b"] == "pending"

    recovered()
    (state_dir(cfg) / "started.json").unlink()
    with pytest.raises(ReconcileError, match=rf"{host['id']}: its {TAG_PLACEMENTS} tags \(serial 2\) say it hosts c/0, "
                                             rf"urgent/0, the state .* says b/0, c/0.*Nothing was changed.*write "
                                             r'\{"serial": 2\} to started.json'):
        api.plan(cfg, time_limit=5)
    (state_dir(cfg) / "started.json").write_text('{"serial": 2}')
    recovered()


def test_an_apply_records_the_serial_it_began_with_before_it_touches_the_cloud(tmp_path, monkeypatch):
    """What makes newer tags believable: a crash after the creates, twice, before the state was saved; the third run
    still finds every replica where the two crashed applies put it."""
    cfg = tmp_path / "cfg"
    jobs = [_gpu_job("a"), _gpu_job("b")]  # one instance, full
    write_config(cfg, _docs("twice", jobs, 4, aws=False))
    api.apply(cfg, time_limit=5)
    for n in range(2):
        jobs += [_gpu_job(f"n{n}0"), _gpu_job(f"n{n}1")]  # a new instance each time
        write_config(cfg, _docs("twice", jobs, 4, aws=False))
        _apply_killed_in("_record_placements", cfg, monkeypatch)
        assert json.loads((state_dir(cfg) / "state.json").read_text())["serial"] == 1  # not saved
        assert json.loads((state_dir(cfg) / "started.json").read_text()) == {"serial": 2 + n}
    nxt = api.plan(cfg, time_limit=5)
    assert not nxt.plan.has_changes, [(j.job, j.action) for j in nxt.plan.jobs]


@pytest.mark.parametrize("body", [b"", b"{", b"[]", b'{"serial": -1}', b'{"serial": "7"}', b'{"serial": true}',
                                  str.encode(f'{{"serial": {2**63}}}')])
def test_a_record_of_the_applies_begun_that_cannot_be_read_is_refused_naming_it(tmp_path, body):
    """Taken as none, an apply that died before it saved would have its tags disbelieved: refused, with what to do."""
    cfg = tmp_path / "cfg"
    write_config(cfg, _docs("unread", [_gpu_job("a")], 2, aws=False))
    (state_dir(cfg)).mkdir(parents=True)
    (state_dir(cfg) / "started.json").write_bytes(body)
    with pytest.raises(ReconcileError, match=f"{state_dir(cfg) / 'started.json'}: cannot read .*Nothing was changed. Delete it"):
        api.plan(cfg, time_limit=5)


def test_a_state_put_back_from_an_older_copy_still_believes_the_tags_of_the_applies_since(tmp_path):
    """StateFileError's advice: restore the state from a backup. Its serial is older than the applies since, whose tags
    say where the work went; the record of the applies begun is kept beside the state, not in it, so they are believed
    (judged against the old copy's serial alone, the instances launched since looked idle and were deleted)."""
    cfg = tmp_path / "cfg"
    jobs = [_gpu_job("a"), _gpu_job("b")]
    write_config(cfg, _docs("restored", jobs, 4, aws=False))
    api.apply(cfg, time_limit=5)
    backup = (state_dir(cfg) / "state.json").read_text()
    for n in range(2):
        jobs += [_gpu_job(f"n{n}0"), _gpu_job(f"n{n}1")]
        write_config(cfg, _docs("restored", jobs, 4, aws=False))
        api.apply(cfg, time_limit=5)
    (state_dir(cfg) / "state.json").write_text(backup)
    nxt = api.plan(cfg, time_limit=5)
    assert not nxt.plan.has_changes, [(j.job, j.action) for j in nxt.plan.jobs]


def test_a_state_and_its_record_of_applies_begun_put_back_together_believe_what_the_agents_run(tmp_path):
    """.reconcile/ put back from a backup at serial 1, state.json and started.json alike; an apply since (serial 2)
    moved b onto c's instance and published it, retagging both (simulated here by the tags it writes). Judged by the
    record put back, those tags were past every apply begun: b stayed on its old host in the plan, which would publish
    it back there (stopping it where it runs). The agents' reports (serial 2) say how far the applies went."""
    cfg = tmp_path / "cfg"
    write_config(cfg, _docs("backup", [_gpu_job("a"), _gpu_job("b"), _gpu_job("c")], 3, aws=False))
    api.apply(cfg, time_limit=5)
    placed = json.loads((state_dir(cfg) / "state.json").read_text())
    assert json.loads((state_dir(cfg) / "started.json").read_text()) == {"serial": placed["serial"]}
    host, other = placed["placements"]["a"][0], placed["placements"]["c"][0]
    gpus = {j: tuple(g[0]) for j, g in placed["gpus"].items()}
    free = tuple(sorted(set(range(4)) - set(gpus["c"])))[:2]
    later = placed["serial"] + 1
    with SimCloud(state_dir(cfg)).world() as w:
        w["instances"][host]["tags"].update(placement_tags(PlacementRecord.of(later, [Placement("a", 0, gpus["a"])])))
        w["instances"][other]["tags"].update(placement_tags(PlacementRecord.of(later, [Placement("b", 0, free),
                                                                                       Placement("c", 0, gpus["c"])])))
    assert api.plan(cfg, time_limit=5).observed.placements["b"] == (host,)  # the record alone: b never left
    (state_dir(cfg) / "agents").mkdir(parents=True, exist_ok=True)
    (state_dir(cfg) / "agents" / f"{other}.json").write_text(json.dumps({"heartbeat_at": time.time(), "serial": later}))
    res = api.plan(cfg, time_limit=5)
    assert res.observed.placements == {"a": (host,), "b": (other,), "c": (other,)}
    assert res.observed.gpu_indices["b"] == (free,)


def test_a_state_edited_at_its_own_serial_yields_to_the_tags_and_both_to_what_the_agents_run(tmp_path):
    """state.json edited (a pull request) at the serial the last apply saved: a and c swapped between their instances.
    The instances' tags, of that apply, say where they run, so the plan keeps them there and says so; and where the
    agents report what runs (bus agents/), that decides over both."""
    cfg = tmp_path / "cfg"
    write_config(cfg, _docs("tie", [_gpu_job("a"), _gpu_job("b"), _gpu_job("c")], 3, aws=False))
    api.apply(cfg, time_limit=5)
    path = state_dir(cfg) / "state.json"
    placed = json.loads(path.read_text())
    host, other = placed["placements"]["a"][0], placed["placements"]["c"][0]
    edited = {**placed, "placements": {**placed["placements"], "a": [other], "c": [host]}}
    path.write_text(json.dumps(edited))
    res = api.plan(cfg, time_limit=5)
    assert res.observed.placements == {j: tuple(ids) for j, ids in placed["placements"].items()}
    assert not res.plan.has_changes, [(j.job, j.action, j.instances) for j in res.plan.jobs]
    assert sum(f"disagree at serial {placed['serial']}" in n for n in res.plan.notes) == 2, res.plan.notes
    (state_dir(cfg) / "agents").mkdir(parents=True, exist_ok=True)
    for iid, running in ((host, ["b/0", "c/0"]), (other, ["a/0"])):
        (state_dir(cfg) / "agents" / f"{iid}.json").write_text(json.dumps({"heartbeat_at": time.time(), "running": running}))
    assert api.plan(cfg, time_limit=5).observed.placements == {"a": (other,), "b": (host,), "c": (host,)}


def test_a_placement_serial_no_apply_can_count_past_is_refused_before_any_change(tmp_path):
    """Tags at the largest serial (2**63-1) with nothing to bound them (the state and the record of the applies begun
    lost): the apply wrote its tags one more and died with a traceback after its creates (PlacementTagError), and a
    state saved one more is refused as corrupt. Refused before any provider change, naming the instance."""
    cfg = tmp_path / "cfg"
    write_config(cfg, _docs("maxed", [_gpu_job("a")], 3, aws=False))
    api.apply(cfg, time_limit=5)
    sim = SimCloud(state_dir(cfg))
    (host,) = [i for i in sim.instances() if i["state"] == "running"]
    with sim.world() as w:
        w["instances"][host["id"]]["tags"][TAG_PLACEMENTS_SERIAL] = str(SERIAL_MAX)
    (state_dir(cfg) / "state.json").unlink()
    (state_dir(cfg) / "started.json").unlink()
    write_config(cfg, _docs("maxed", [_gpu_job("a"), _gpu_job("b"), _gpu_job("c")], 3, aws=False))
    before = sim.instances()
    with pytest.raises(ReconcileError, match=f"{host['id']}.*{SERIAL_MAX}"):
        api.apply(cfg, time_limit=5)
    assert sim.instances() == before


def test_stale_tags_lose_to_a_newer_state_and_the_next_apply_rewrites_them(tmp_path):
    cfg = tmp_path / "cfg"
    write_config(cfg, _docs("stale", [_gpu_job("a"), _gpu_job("b")], 3, aws=False))
    api.apply(cfg, time_limit=5)
    iid, hosted = next(iter(_expected(cfg).items()))
    stale = sorted(hosted)[1:]  # as if a tag write that dropped one replica had failed, long ago
    with SimCloud(state_dir(cfg)).world() as w:
        w["instances"][iid]["tags"].update(placement_tags(PlacementRecord.of(0, stale)))
    res = api.plan(cfg, time_limit=5)
    assert not res.plan.has_changes
    assert any(iid in n and "(serial 0)" in n and "the state wins" in n for n in res.plan.notes)
    api.apply(cfg, time_limit=5)
    tags = _sim_tags(cfg, "stale")()[iid]
    assert set(read_placements(tags).placements) == _expected(cfg)[iid]
    assert not api.plan(cfg, time_limit=5).plan.notes


def test_sim_never_tags_an_instance_it_does_not_own(tmp_path):
    sim = SimCloud(tmp_path)
    foreign = sim.plant("aws", "us-east-1", "us-east-1a", "g5.xlarge", {TAG_FLEET: "someone-else"})
    bare = sim.plant("aws", "us-east-1", "us-east-1a", "g5.xlarge", {})
    prov = SimProvider(ProviderContext(fleet="mine", state_dir=tmp_path))
    before = {i["id"]: i["tags"] for i in sim.instances()}
    for iid in (foreign, bare):
        handle = instance(iid, "p", "aws", "us-east-1", "us-east-1a", "g5.xlarge", fleet="mine")
        with pytest.raises(OwnershipError, match="refusing to tag"):
            prov.record_placements(handle, PlacementRecord.of(1, [Placement("a", 0)]))
    assert {i["id"]: i["tags"] for i in sim.instances()} == before


# ---------------------------------------------------------------- AWS specifics


def _target() -> PoolTarget:
    return PoolTarget(name="a10g", cloud="aws", region="us-east-1", zones=("us-east-1a",), instance_types=("g5.xlarge",),
                      settings={"ami": AMI, "security_groups": [], "subnets": {}})


def test_aws_long_lists_chunk_over_tags_and_shrink_cleanly(aws_env, tmp_path):
    fleet = f"chunk-{uuid.uuid4().hex[:8]}"
    prov = AwsProvider(ProviderContext(fleet=fleet, state_dir=tmp_path, options={"endpoint_url": aws_env}))
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=aws_env)
    many = PlacementRecord.of(4, [Placement(f"cpu-shard-{i:03d}", i % 2) for i in range(80)])
    made = prov.create(CreateRequest(key="k-chunk", pool=_target(), zone="us-east-1a", instance_type="g5.xlarge",
                                     market="on-demand", tags=ownership_tags(fleet, "a10g", "k-chunk"), placements=many))

    def raw() -> dict[str, str]:
        d = ec2.describe_instances(InstanceIds=[made.id])["Reservations"][0]["Instances"][0]
        return {t["Key"]: t["Value"] for t in d["Tags"]}

    tags = raw()
    keys = [k for k in tags if k.startswith(TAG_PLACEMENTS + "-") and k != TAG_PLACEMENTS_SERIAL]
    assert len(keys) == 5 and all(len(v) <= TAG_VALUE_MAX for v in tags.values())
    assert read_placements(tags) == many
    (seen,) = prov.observe([_target()])
    assert read_placements(seen.tags) == many  # observe reads them back like any tag
    few = PlacementRecord.of(5, [Placement("cpu-shard-000", 0)])
    prov.record_placements(seen, few)
    after = raw()
    assert {k for k in after if k.startswith(TAG_PLACEMENTS)} == {TAG_PLACEMENTS, TAG_PLACEMENTS_SERIAL}
    assert read_placements(after) == few and after[TAG_FLEET] == fleet


def test_ec2s_tag_and_client_token_limits_are_held_and_the_longest_tags_the_provider_writes_pass(aws_env, tmp_path):
    """EC2 refuses a tag key over 127 characters or starting aws:, a tag value over 256 (the API reference's Tag) and a
    ClientToken over 64 ASCII characters ("Ensuring idempotency"); moto took them all, so tests/ec2_params.py refuses
    them as EC2 does. What the provider writes at its longest passes: 63-character names, a full MIG layout, and
    MAX_TAGS full placement chunks of 63-character job names, at launch and when retagged."""
    from botocore.exceptions import ClientError

    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=aws_env)
    for tags, token, why in (([{"Key": "k", "Value": "v" * 257}], None, "at most 256"), ([{"Key": "k" * 128, "Value": ""}], None,
                             "at most 127"), ([{"Key": "AWS:x", "Value": "v"}], None, "reserved"), ([], "t" * 65, "64 ASCII")):
        extra = {"TagSpecifications": [{"ResourceType": "instance", "Tags": tags}]} if tags else {"ClientToken": token}
        with pytest.raises(ClientError, match=why):
            ec2.run_instances(ImageId=AMI, InstanceType="g5.xlarge", MinCount=1, MaxCount=1, **extra)
    with pytest.raises(ClientError, match="at most 256"):
        ec2.create_tags(Resources=["i-0123456789abcdef0"], Tags=[{"Key": "k", "Value": "v" * 257}])

    fleet = ("f" + uuid.uuid4().hex + "." + "x" * 63)[:63]  # the longest names the config allows ([a-z0-9.-], 63)
    key = "0123456789ab-0001-15"  # a plan's key at its 16th launch attempt (reconciler/apply.py)
    tags = {**ownership_tags(fleet, "p" * 63, key), "fleetops.io/plan": "0123456789ab", TAG_FLEET_UID: "0123456789abcdef",
            TAG_MIG: "-".join(["1g.10gb"] * 7), TAG_RESERVATION: "r" * 63}
    def entry(i: int) -> Placement:  # 84, 83, 83 characters (`JOB/9999@0+2+4+6+8+10+12`): three fill a value to 256
        return Placement(f"{i:04d}" + "j" * (59 if i % 3 == 0 else 58), 9999, (0, 2, 4, 6, 8, 10, 12))

    entries: list[Placement] = []  # as many as the tags hold before they overflow
    while not placement_tags(PlacementRecord.of(SERIAL_MAX, entries + [entry(len(entries))]))[TAG_PLACEMENTS].startswith("!"):
        entries.append(entry(len(entries)))
    full = PlacementRecord.of(SERIAL_MAX, entries)
    written = placement_tags(full)
    assert len(written) == MAX_TAGS + 1 and max(len(v) for v in written.values()) == TAG_VALUE_MAX
    prov = AwsProvider(ProviderContext(fleet=fleet, state_dir=tmp_path, options={"endpoint_url": aws_env}))
    made = prov.create(CreateRequest(key=key, pool=_target(), zone="us-east-1a", instance_type="g5.xlarge", market="on-demand",
                                     tags=tags, placements=full))
    d = ec2.describe_instances(InstanceIds=[made.id])["Reservations"][0]["Instances"][0]
    assert read_placements({t["Key"]: t["Value"] for t in d["Tags"]}) == full
    prov.record_placements(made, PlacementRecord.of(SERIAL_MAX, entries[1:]))


def test_aws_never_tags_an_instance_it_does_not_own(aws_env, tmp_path):
    fleet = f"own-{uuid.uuid4().hex[:8]}"
    prov = AwsProvider(ProviderContext(fleet=fleet, state_dir=tmp_path, options={"endpoint_url": aws_env}))
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=aws_env)
    mine = prov.create(CreateRequest(key="k-own", pool=_target(), zone="us-east-1a", instance_type="g5.xlarge",
                                     market="on-demand", tags=ownership_tags(fleet, "a10g", "k-own")))
    bare = ec2.run_instances(ImageId=AMI, InstanceType="g5.xlarge", MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    other = ec2.run_instances(ImageId=AMI, InstanceType="g5.xlarge", MinCount=1, MaxCount=1, TagSpecifications=[
        {"ResourceType": "instance", "Tags": [{"Key": TAG_FLEET, "Value": "someone-else"}]}])["Instances"][0]["InstanceId"]

    def tags(iid: str) -> dict[str, str]:
        d = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
        return {t["Key"]: t["Value"] for t in d.get("Tags", [])}

    before = {iid: tags(iid) for iid in (bare, other)}
    for iid in (bare, other):
        with pytest.raises(OwnershipError, match="refusing to tag"):
            prov.record_placements(mine.__class__(**{**mine.__dict__, "id": iid}), PlacementRecord.of(1, [Placement("a", 0)]))
    assert {iid: tags(iid) for iid in (bare, other)} == before
    prov.record_placements(mine, PlacementRecord.of(1, [Placement("a", 0)]))  # its own instance: allowed
    assert tags(mine.id)[TAG_PLACEMENTS] == "a/0"
