"""Apply-time benchmark: N creates against the Compute Engine fake with a real operation latency.

    python -m bench.apply_parallel [--latency S] [--sizes 1,100] [--parallelism N]

Each size is a fresh config whose only pool has min_instances = max_instances = N (so the plan is N creates, nothing
else) and a fresh fake whose operations take --latency seconds to be DONE (zoneOperations.wait blocks until then, as
the real one does). The time measured is the apply's: from the first create's "started" event to the last one's
"finished" (reconciler.apply's on_event), not the plan. Issue 22's target: 100 creates in under 2x the time of one.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from reconciler import api
from tests.fleetkit import doc, tenant, topology, write_config
from tests.gce_fake import GceFake

ZONES = ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"]


def run(n: int, latency: float, parallelism: int | None) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as tmp, GceFake() as gce:
        gce.op_latency = latency
        pool = doc("Pool", "l4", {"cloud": "gcp", "region": "us-central1", "zones": ZONES, "instance_types": ["g2-standard-4"],
                                  "market": "on-demand", "min_instances": n, "max_instances": n})
        cfg = write_config(Path(tmp) / "cfg", [topology("bench-apply", clouds={"gcp": {"us-central1": ZONES}}), tenant("t"), pool])
        opts = {"endpoint": gce.url, "project": "bench"}
        if parallelism:
            opts["parallelism"] = str(parallelism)
        stamps: list[tuple[str, float]] = []
        res = api.apply(cfg, provider="gcp", options=opts, on_event=lambda e: stamps.append((e.phase, time.monotonic())))
        assert res.report.ok and len(res.report.created) == n, res.report.failures
        starts = [t for p, t in stamps if p == "started"]
        ends = [t for p, t in stamps if p == "finished"]
        return max(ends) - min(starts), gce.max_running_ops


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency", type=float, default=2.0)
    ap.add_argument("--sizes", default="1,100")
    ap.add_argument("--parallelism", type=int, default=None)
    a = ap.parse_args()
    rows = []
    for n in (int(s) for s in a.sizes.split(",")):
        secs, most = run(n, a.latency, a.parallelism)
        rows.append((n, secs, most))
        print(f"{n:>5} creates: {secs:6.2f} s  (at most {most} operations at once)")
    one = rows[0][1]
    for n, secs, _ in rows[1:]:
        print(f"{n} creates took {secs / one:.2f}x the time of {rows[0][0]} (target for 100: < 2x)")


if __name__ == "__main__":
    main()
