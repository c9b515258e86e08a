"""The runtime under faults an outside tester would inject: the state store failing the agent's writes in the middle of
a spot notice, and the like. Real agent and replica processes on the local bus, faults injected at the backend; every
wait polls for a condition."""

from __future__ import annotations

import json
import sys
import time

from reconciler.backend import LocalBackend
from reconciler.errors import ReconcileError
from reconciler.runtime.agent import Agent
from reconciler.runtime.bus import Bus
from reconciler.runtime.notices import FileNotice
from reconciler.runtime.runtimes import ProcessRuntime
from tests.test_runtime_agent import entry, run_until

PY = sys.executable

# A replica that says it is ready, then on SIGTERM writes its checkpoint and exits 0.
CHECKPOINTER = [PY, "-c", "import os, signal, sys, time\n"
                          "def stop(s, f):\n"
                          "    open(os.path.join(os.environ['FLEETOPS_CHECKPOINT_DIR'], 'model.bin'), 'w').write('step 7')\n"
                          "    sys.exit(0)\n"
                          "signal.signal(signal.SIGTERM, stop)\n"
                          "print('ready', flush=True)\n"
                          "time.sleep(600)"]
CK = {"dir": "/ckpt", "signal": "SIGTERM", "grace_seconds": 30}


class FailingRunWrites(LocalBackend):
    """The real local backend whose writes of run records fail while `failing` (the store full, read-only, or cut off
    for the agent's `runs/` writes)."""

    failing = False

    def write_key(self, key: str, body: bytes) -> None:
        if self.failing and key.startswith("runs/"):
            raise ReconcileError(f"local bus: cannot write .reconcile/{key}: No space left on device")
        super().write_key(key, body)


def test_a_replica_stopped_by_a_notice_while_its_record_cannot_be_written_is_reported_once_the_store_takes_it(tmp_path):
    """A spot notice while the store refuses the agent's run records (measured on a full, then a read-only, tmpfs
    `.reconcile/`): the replica checkpointed and stopped, its Stopped record's one write failed, and the agent dropped it.
    Once the store took writes again the agent said "interruption handled: every replica stopped and reported" while
    `runs/ft/0.json` said Running for good (status showed a job running on a reclaimed node). Now the record is written
    again each poll until the store takes it, and the notice is handled only then."""
    store = FailingRunWrites(tmp_path)
    bus = Bus(store)
    notice = tmp_path / "notice.json"
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("ft", CHECKPOINTER, checkpoint=CK, mode="service")]})
    a = Agent("i-0", bus, ProcessRuntime(), tmp_path / "i-0", address="127.0.0.1", poll=0.05, heartbeat=0.2, backoff=0.1,
              checkpoint_root=tmp_path / "i-0" / "disk", log=lambda m: None, checkpoint_sync=True, notice=FileNotice(notice))
    try:
        run_until([a], lambda: (r := bus.run("ft", 0)) and r["log_tail"][-1:] == ["ready"])
        store.failing = True
        notice.write_text(json.dumps({"reason": "spot-interruption", "time": "now"}))
        run_until([a], lambda: not a.uploads and bus.agent("i-0")["running"] == [])  # stopped and uploaded
        for _ in range(5):  # (polls with the store still refusing the record)
            a.tick()
            time.sleep(0.05)
        assert not a.notice_done  # before: handled, its record Running
        assert "cannot write the run record of ft/0" in bus.agent("i-0").get("write_failed", "")
        store.failing = False
        run_until([a], lambda: a.notice_done)
        rec = bus.run("ft", 0)
        assert (rec["phase"], rec["reason"]) == ("Stopped", "Interrupted"), rec
        a.tick()
        assert "write_failed" not in bus.agent("i-0")
    finally:
        for rep in a.replicas.values():
            if rep.handle is not None:
                a.runtime.kill(rep.handle)

