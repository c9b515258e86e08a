"""The simulated cloud's store: a snapshot plus a journal, read by several processes."""

from __future__ import annotations

import json
import subprocess
import sys

import providers.sim as sim_mod
from providers.sim import SimCloud

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


def _other_process_sees(state_dir) -> list[dict]:
    """The world as a fresh process reads it (no cache shared with this one)."""
    code = f"import json; from providers.sim import SimCloud; print(json.dumps(SimCloud({str(state_dir)!r}).instances()))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def _plant(sim: SimCloud, n: int) -> list[str]:
    return [sim.plant("aws", "us-east-1", "us-east-1a", "p4d.24xlarge", {"fleetops.io/fleet": "f", "n": str(k)}) for k in range(n)]


def test_a_journal_line_cut_short_by_a_kill_is_not_a_call_that_happened(tmp_path):
    sim = SimCloud(tmp_path)
    ids = _plant(sim, 3)
    with open(sim.journal, "ab") as f:  # what a process killed in the middle of its append leaves
        f.write(b'{"instances":{"sim-aws-09999":{"id":"sim-aws-09')
    assert sorted(i["id"] for i in _other_process_sees(tmp_path)) == ids
    sim_mod._CACHE.clear()  # as a new process: read the files again
    more = _plant(sim, 1)  # the next call drops the cut line and appends after it
    assert sim.journal.read_bytes().endswith(b"\n")
    assert sorted(i["id"] for i in _other_process_sees(tmp_path)) == ids + more


def test_the_journal_is_folded_into_the_snapshot_and_other_processes_follow(tmp_path, monkeypatch):
    monkeypatch.setattr(sim_mod, "COMPACT_BYTES", 2000)
    sim = SimCloud(tmp_path)
    ids = _plant(sim, 40)
    # folded whenever it outgrew both the threshold and the snapshot (one call's line over at most)
    assert sim.journal.stat().st_size <= max(2000, sim.path.stat().st_size) + 1000
    assert len(json.loads(sim.path.read_text())["instances"]) >= 30
    sim.interrupt(ids[0])
    seen = {i["id"]: i["state"] for i in _other_process_sees(tmp_path)}
    assert sorted(seen) == ids and seen[ids[0]] == "terminated" and seen[ids[1]] == "running"
    # ...and this process follows what another one wrote.
    code = f"from providers.sim import SimCloud; SimCloud({str(tmp_path)!r}).interrupt({ids[1]!r})"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
    assert {i["id"]: i["state"] for i in sim.instances()}[ids[1]] == "terminated"


def test_a_lost_journal_is_refused_not_read_as_an_empty_world(tmp_path):
    """The snapshot names the journal begun with it. Before, a zero-byte (or deleted) cloud.journal read as
    "no calls since the snapshot": the instances it recorded silently vanished and the next plan created them again."""
    import pytest

    from providers.errors import ProviderError

    sim = SimCloud(tmp_path)
    ids = _plant(sim, 3)
    assert sorted(i["id"] for i in sim.instances()) == ids
    kept = sim.journal.read_bytes()
    for lose in (lambda: sim.journal.write_bytes(b""), sim.journal.unlink):
        lose()
        sim_mod._CACHE.clear()  # as a new process
        with pytest.raises(ProviderError, match=r"cloud.journal: the simulated cloud's journal is (empty|missing), but .*cloud.json says "
                                                r"one was begun with it.*are lost. Nothing was changed. Restore cloud.journal"):
            sim.instances()
        sim.journal.write_bytes(kept)
    sim_mod._CACHE.clear()
    assert sorted(i["id"] for i in sim.instances()) == ids


def test_a_lost_snapshot_is_refused_not_read_as_an_empty_world(tmp_path, monkeypatch):
    """The symmetric case: cloud.json gone, cloud.journal kept. Before, the journal (whose header says it continues
    a snapshot) was replayed over an empty world: the snapshot's instances vanished and the next plan replaced them
    as interrupted. Only the first call's own line, killed before its snapshot was written, rebuilds the world alone."""
    import pytest

    from providers.errors import ProviderError

    sim = SimCloud(tmp_path)
    ids = _plant(sim, 2)
    for calls_since in (0, 1):  # a journal of its header alone, and one with a call after it
        ids += _plant(sim, calls_since)
        kept = sim.path.read_bytes()
        sim.path.unlink()
        sim_mod._CACHE.clear()  # as a new process
        with pytest.raises(ProviderError, match=r"cloud.json: the simulated cloud's snapshot is missing, but .*cloud.journal "
                                                r"\(journal [0-9a-f]+\) continues one.*Nothing was changed. Restore cloud.json from a "
                                                r"backup, or delete .*sim to start an empty simulated cloud"):
            sim.instances()
        assert not sim.path.exists()  # nothing written over it
        sim.path.write_bytes(kept)
        sim_mod._CACHE.clear()
        assert sorted(i["id"] for i in sim.instances()) == ids
    # A first call killed between its journal line and its snapshot: the line is the whole world, and is read.
    class Killed(BaseException):
        pass

    def killed(*a):
        raise Killed

    fresh = SimCloud(tmp_path / "fresh")
    monkeypatch.setattr(sim_mod.os, "replace", killed)  # killed before the snapshot's rename
    with pytest.raises(Killed):
        _plant(fresh, 1)
    monkeypatch.undo()
    assert not fresh.path.exists() and fresh.journal.read_bytes().count(b"\n") == 1
    sim_mod._CACHE.clear()
    first = [i["id"] for i in fresh.instances()]
    assert first == ["sim-aws-00001"]
    assert [i["id"] for i in _other_process_sees(tmp_path / "fresh")] == first


def test_a_fold_cut_between_its_two_renames_keeps_every_instance(tmp_path, monkeypatch):
    """A kill after the new snapshot replaced the old one but before the new journal did: the old journal's
    calls are all in the snapshot, so it is set aside (not refused, not replayed over newer state)."""
    sim = SimCloud(tmp_path)
    ids = _plant(sim, 2)
    old_journal = sim.journal.read_bytes()
    monkeypatch.setattr(sim_mod, "COMPACT_BYTES", 0)  # the next call folds
    monkeypatch.setattr(SimCloud, "_begin_journal", lambda self, token: None)  # ...and is killed before the journal's rename
    ids += _plant(sim, 1)
    monkeypatch.undo()
    assert sim.journal.read_bytes().startswith(old_journal)  # the old journal, under a snapshot that names another
    sim_mod._CACHE.clear()
    assert sorted(i["id"] for i in sim.instances()) == ids
    ids += _plant(sim, 1)
    assert sorted(i["id"] for i in _other_process_sees(tmp_path)) == ids


def test_unreadable_sim_files_are_named_as_such(tmp_path):
    """Before: cloud.json unreadable was "corrupt: not valid JSON (Permission denied)" with advice to delete the
    whole simulated world; cloud.journal unreadable and cloud.lock a directory were `unexpected` bug reports."""
    import pytest

    from providers.errors import ProviderError

    sim = SimCloud(tmp_path)
    _plant(sim, 2)
    for name in ("cloud.json", "cloud.journal", "cloud.lock"):
        path = sim.dir / name
        kept = path.read_bytes()
        path.unlink()
        path.mkdir()
        sim_mod._CACHE.clear()
        with pytest.raises(ProviderError) as err:
            sim.instances()
        msg = str(err.value)
        assert msg.startswith(f"{path}: cannot ") and "Is a directory" in msg and "corrupt" not in msg and "delete" not in msg, msg
        path.rmdir()
        path.write_bytes(kept)
    sim_mod._CACHE.clear()
    assert len(sim.instances()) == 2


def test_a_fault_written_by_hand_that_means_nothing_is_an_error_naming_the_file(tmp_path):
    """A NaN quota limit (json writes and reads `NaN`) made every later plan fail with "unexpected ValueError: cannot
    convert float NaN to integer"; now the world is refused, naming the file, and `sim quota --remove` sets it right."""
    import pytest

    from providers.errors import ProviderError

    sim = SimCloud(tmp_path)
    _plant(sim, 1)
    data = json.loads(sim.path.read_text())
    data["faults"]["quotas"] = [{"name": "q", "cloud": "aws", "region": "", "unit": "vCPUs", "limit": float("nan"),
                                 "market": None, "gpu_type": None, "instance_types": None}]
    sim.path.write_text(json.dumps(data))
    sim.journal.write_bytes(sim.journal.read_bytes().split(b"\n")[0] + b"\n")  # its header: no call since the snapshot
    sim_mod._CACHE.clear()
    with pytest.raises(ProviderError, match=rf"^{sim.path}: the simulated cloud's injected faults are invalid: faults.quotas\[0\] limit nan"):
        with sim.world(write=False):
            pass
    sim.set_quota("q", "aws", "", "vCPUs", 0, remove=True)
    with sim.world(write=False) as w:
        assert w["faults"]["quotas"] == []
    for bad in ({"throttle": -3}, {"latency_ms": -5}, {"reject_every": 1.5}):
        with pytest.raises(ProviderError, match="not a"):
            sim.set_fault(**bad)
    with pytest.raises(ProviderError, match="limit inf is not a number 0 or more"):
        sim.set_quota("q", "aws", "", "vCPUs", float("inf"))


def test_an_instance_the_reconciler_terminated_during_its_notice_is_not_an_error_to_reclaim(tmp_path):
    """A controller replaces an instance on its interruption notice: the apply may terminate it while the notice still
    runs (its agent checkpointing). The reclaim then finds it gone; it raised "sim: no live instance", and the
    controller test failed so under load (test_runtime_sim, 2026-12-01). Now it is a reclaim of nothing: the record
    keeps the reconciler's reason."""

    class NoticeRace(SimCloud):
        """The sim, with the controller's apply landing while the notice runs (an agent alive to be noticed)."""

        def agent_alive(self, instance_id: str) -> bool:
            return True

        def deliver_notice(self, instance_id, reason, notice_seconds):
            with self.world() as w:  # (what the sim provider's delete writes)
                w["instances"][instance_id].update(state="terminated", terminated_reason="deleted-by-reconciler")
            return "checkpointed"

    sim = NoticeRace(tmp_path)
    iid = _plant(sim, 1)[0]
    out = sim.interrupt(iid)
    assert out["terminated_during_notice"] and out["terminated_reason"] == "deleted-by-reconciler"
    assert {i["id"]: i["terminated_reason"] for i in SimCloud(tmp_path).instances()}[iid] == "deleted-by-reconciler"
    import pytest

    from providers.errors import ProviderError

    with pytest.raises(ProviderError, match="no live instance"):  # (terminated before the call: still refused)
        sim.interrupt(iid)


def test_an_agent_that_dies_during_its_notice_is_not_reported_checkpointed(tmp_path):
    """The notice's wait ended when the agent died, and said "checkpointed" (no warning from `sim interrupt`) although
    the agent never reported its replicas checkpointed and stopped. Now it says the agent died."""
    import subprocess
    import sys

    from providers.sim import _starttime

    sim = SimCloud(tmp_path)
    iid = _plant(sim, 1)[0]
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])  # an "agent" that dies in the notice
    try:
        d = sim.agent_dir(iid)
        d.mkdir(parents=True)
        (d / "agent.pid").write_text(f"{proc.pid} {_starttime(proc.pid)}\n")
        assert sim.agent_alive(iid)
        out = sim.interrupt(iid, notice_seconds=30)
    finally:
        proc.wait()
    assert (out["checkpointed"], out["notice"]) == (False, "agent died"), out


def test_a_huge_journal_is_refused_unread_and_left_as_it_is(tmp_path, monkeypatch):
    """cloud.journal was read whole from where a process last read it: a huge one (here 300 MiB of zeros past the
    calls, sparse; the bound patched to 64 MiB) was taken into memory, then cut away as "a line a killed process left".
    No sim writes a journal that large (it is folded into the snapshot): refused unread, naming it, nothing changed."""
    import os
    import tracemalloc

    import pytest

    from providers.errors import ProviderError

    monkeypatch.setattr(sim_mod, "MAX_JOURNAL_BYTES", 64 << 20, raising=False)
    sim = SimCloud(tmp_path)
    ids = _plant(sim, 3)
    os.truncate(sim.journal, 300 << 20)
    sim_mod._CACHE.clear()  # as a new process
    tracemalloc.start()
    try:
        with pytest.raises(ProviderError, match=r"cloud.journal: the simulated cloud's record is corrupt: it is larger than 64 MiB, "
                                                r"which no sim writes. Nothing was changed"):
            _plant(sim, 1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 << 20, f"{peak / 2**20:.0f} MiB allocated"
    assert sim.journal.stat().st_size == 300 << 20 and len(json.loads(sim.path.read_text())["instances"]) <= len(ids)
