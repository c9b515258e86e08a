"""Creates and deletes run concurrently (issue 22, item 3): bounded per provider and region, make before break
between the phases, progress events on the caller's thread. Against the Compute Engine fake with a real
operation latency (an insert's operation is DONE only after it, and zoneOperations.wait blocks until then)."""

from __future__ import annotations

import threading
from pathlib import Path

from reconciler import api
from tests.fleetkit import copy_example

PROJECT = "fleet-test-project"


def _events(out: list, threads: set):
    def on_event(e):
        out.append(e)
        threads.add(threading.get_ident())
    return on_event


def test_creates_run_concurrently_within_the_providers_parallelism(gce, tmp_path):
    gce.op_latency = 0.5
    cfg = copy_example(tmp_path, "gcp-only")
    opts = {"endpoint": gce.url, "project": PROJECT, "parallelism": "3"}
    events: list = []
    threads: set = set()
    res = api.apply(cfg, provider="gcp", options=opts, on_event=_events(events, threads))
    assert res.report.ok and len(res.report.created) == len(res.plan.creates) == 5
    assert 2 <= gce.max_running_ops <= 3  # concurrent, never more than the region's bound
    assert threads == {threading.get_ident()}  # progress callbacks only on the caller's thread
    started = [e.target for e in events if e.phase == "started" and e.action == "create"]
    finished = [e.target for e in events if e.phase == "finished" and e.action == "create"]
    assert sorted(started) == sorted(finished) == sorted(res.report.created)


def test_one_at_a_time_when_parallelism_is_one(gce, tmp_path):
    gce.op_latency = 0.2
    cfg = copy_example(tmp_path, "gcp-only")
    res = api.apply(cfg, provider="gcp", options={"endpoint": gce.url, "project": PROJECT, "parallelism": "1"})
    assert res.report.ok and gce.max_running_ops == 1


def test_deletes_start_only_after_every_create_finished(gce, tmp_path):
    gce.op_latency = 0.3
    cfg = copy_example(tmp_path, "gcp-only")
    opts = {"endpoint": gce.url, "project": PROJECT, "parallelism": "4"}
    assert api.apply(cfg, provider="gcp", options=opts).report.ok
    fleet = Path(cfg) / "fleet.yaml"
    fleet.write_text(fleet.read_text().replace("instance_types: [g2-standard-4, g2-standard-48]",
                                               "instance_types: [g2-standard-48]"))
    events: list = []
    res = api.apply(cfg, provider="gcp", options=opts, on_event=_events(events, set()), allow_destroy=10)
    assert res.report.ok and res.plan.creates and res.plan.deletes
    order = [(e.phase, e.action) for e in events if e.action in ("create", "delete")]
    last_create = max(i for i, (p, a) in enumerate(order) if a == "create" and p == "finished")
    first_delete = min(i for i, (p, a) in enumerate(order) if a == "delete" and p == "started")
    assert last_create < first_delete  # make before break
    assert gce.max_running_ops >= 2
