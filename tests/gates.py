"""Hold a `reconcile apply` subprocess at an exact launch, so a test kills or races it there.

A kill "after 3 launches" found by polling the cloud while the apply runs on a slowed cloud is a
race: on a loaded 2-core machine the poll can see the 3rd instance after the 4th or the 10th was
launched, or the apply can end before a second process has even started. Instead the subprocess
gets a sitecustomize (in that process only) that sends `after` launches and holds every later one
unsent (`before`), or also holds the answer of the last of the `after` (`answer-lost`), and says
so with a file once every launch sent was answered (launch lanes run concurrently). The test then acts at that exact point, and
releases the gate (or kills the process). What the cloud does and what the apply does with its
answers are unchanged: the hook wraps only the launch call (the sim provider's create, or
botocore's RunInstances, not its dry runs: apply's permission check)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

from tests.fleetkit import poll_until

_SITE = textwrap.dedent('''
    import os
    import threading
    import time
    from pathlib import Path

    _dir = Path(os.environ["FLEETOPS_TEST_GATE_DIR"])
    _after = int(os.environ["FLEETOPS_TEST_GATE_AFTER"])
    _mode = os.environ["FLEETOPS_TEST_GATE_MODE"]
    _lock = threading.Lock()
    _sent = [0]
    _done = [0]


    def _hold():
        """Once every launch sent has been answered (lanes launch concurrently), say so, and wait for the release."""
        while _done[0] < _after and not (_dir / "release").exists():
            time.sleep(0.05)
        (_dir / f"reached-{os.getpid()}").write_text(str(_done[0]))
        while not (_dir / "release").exists():
            time.sleep(0.05)


    def _gated(call):
        def launch(*args, **kwargs):
            with _lock:
                go = _sent[0] < _after
                _sent[0] += go
            if not go:
                _hold()  # launches past `after` are not sent while held
            out = call(*args, **kwargs)
            with _lock:
                _done[0] += 1
                last = _done[0] == _after
            if _mode == "answer-lost" and last:
                _hold()
            return out
        return launch


    if os.environ["FLEETOPS_TEST_GATE_TARGET"] == "aws":
        import botocore.client

        _call = botocore.client.BaseClient._make_api_call
        _launch = _gated(_call)

        def _api_call(self, operation, params):
            launch = operation == "RunInstances" and not params.get("DryRun")  # (a dry run launches nothing)
            return (_launch if launch else _call)(self, operation, params)

        botocore.client.BaseClient._make_api_call = _api_call
    else:
        import providers.sim

        providers.sim.SimProvider.create = _gated(providers.sim.SimProvider.create)
''')


class Gate:
    """target: "sim" or "aws"; after: launches that complete before the hold; mode: "before" (the next launch is
    never sent while held) or "answer-lost" (launch `after` is made, its answer held)."""

    def __init__(self, root: Path, target: str, after: int, mode: str = "before"):
        self.dir = root
        root.mkdir(parents=True, exist_ok=True)
        (root / "sitecustomize.py").write_text(_SITE)
        self.vars = {"FLEETOPS_TEST_GATE_DIR": str(root), "FLEETOPS_TEST_GATE_AFTER": str(after),
                     "FLEETOPS_TEST_GATE_MODE": mode, "FLEETOPS_TEST_GATE_TARGET": target}

    def env(self, base: dict | None = None) -> dict:
        base = dict(os.environ if base is None else base)
        return {**base, **self.vars, "PYTHONPATH": os.pathsep.join(p for p in (str(self.dir), base.get("PYTHONPATH", "")) if p)}

    def reached(self) -> set[int]:
        """Pids of the processes held at the gate now (or before they were released)."""
        return {int(p.name.split("-", 1)[1]) for p in self.dir.glob("reached-*")}

    def release(self) -> None:
        (self.dir / "release").touch()

    def wait(self, cond, what: str, timeout: float = 600.0):
        """Poll cond() until it is true: generous, as a loaded machine needs (importing the solver alone takes seconds)."""
        return poll_until(cond, what, timeout, every=0.05)
