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
    assert sim.journal.stat().st_size < 2000 + 1000  # folded at least once
    assert len(json.loads(sim.path.read_text())["instances"]) >= 30
    sim.interrupt(ids[0])
    seen = {i["id"]: i["state"] for i in _other_process_sees(tmp_path)}
    assert sorted(seen) == ids and seen[ids[0]] == "terminated" and seen[ids[1]] == "running"
    # ...and this process follows what another one wrote.
    code = f"from providers.sim import SimCloud; SimCloud({str(tmp_path)!r}).interrupt({ids[1]!r})"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
    assert {i["id"]: i["state"] for i in sim.instances()}[ids[1]] == "terminated"
