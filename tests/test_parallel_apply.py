"""Creates and deletes run concurrently (issue 22, item 3): bounded per provider and region, make before break
between the phases, progress events on the caller's thread. Against the Compute Engine fake with a real
operation latency (an insert's operation is DONE only after it, and zoneOperations.wait blocks until then)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from reconciler import api
from reconciler.errors import ApplyError
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


def test_rate_limited_inserts_are_retried_with_backoff_and_each_instance_lands_once(gce, tmp_path):
    """Issue 22 item 3: GCE's write quotas are per minute; an insert answered 403/429 rateLimitExceeded (or 503) is
    tried again with backoff inside the provider's retry_window, with the same requestId, so the apply finishes and
    no instance is created twice."""
    cfg = copy_example(tmp_path, "gcp-only")
    opts = {"endpoint": gce.url, "project": PROJECT, "parallelism": "1"}
    # Without a window only the minimum tries (4): five refusals in a row fail the first create.
    gce.fail_next(403, "rateLimitExceeded", "Rate Limit Exceeded", method="POST", path_contains="/instances", count=5)
    with pytest.raises(ApplyError, match="Rate Limit Exceeded") as e:
        api.apply(cfg, provider="gcp", options={**opts, "retry_window": "0.001"})
    # finetune's other replica's instance was launched, then rolled back: finetune is not placed without +1's
    assert "3 created, 1 rolled back, 0 deleted" in str(e.value)
    # With the window (300 s by default) the same burst is ridden out: the next apply's creates all land.
    gce.log.clear()
    gce.fail_next(403, "rateLimitExceeded", "Rate Limit Exceeded", method="POST", path_contains="/instances", count=4)
    gce.fail_next(503, "backendError", "Backend Error", method="POST", path_contains="/instances", count=1)
    res = api.apply(cfg, provider="gcp", options=opts)
    assert res.report.ok and len(res.report.created) == len(res.plan.creates), res.report.failures
    inserts = [r for r in gce.requests("POST", "/instances") if r[1].endswith("/instances")]  # (not the check)
    assert len(inserts) == len(res.plan.creates) + 5  # five refusals in a row: past the 4 tries, inside the window
    assert len([i for i in gce.instances(PROJECT) if i["status"] == "RUNNING"]) == 5
    ids = [q.get("requestId", [""])[-1] for _, _, q in inserts]
    assert all(ids) and len(set(ids)) == len(res.plan.creates)  # a retry repeats its requestId


def test_a_create_throttled_through_every_retry_says_what_it_was_and_what_to_do(gce, tmp_path):
    """A create still refused when its retries run out was reported as GCE's bare refusal ("HTTP 403: Rate Limit
    Exceeded"), the same line as a request GCE rejects for good: nothing said it had been retried, or what to do."""
    cfg = copy_example(tmp_path, "gcp-only")
    opts = {"endpoint": gce.url, "project": PROJECT, "parallelism": "1", "retry_window": "0.001"}
    gce.fail_next(403, "rateLimitExceeded", "Rate Limit Exceeded", method="POST", path_contains="/instances", count=4)
    with pytest.raises(ApplyError) as e:
        api.apply(cfg, provider="gcp", options=opts)
    line = next(ln for ln in str(e.value).splitlines() if "Rate Limit Exceeded" in ln)
    assert "still there after every retry" in line and "the next run tries again" in line
    assert "-o parallelism" in line, line


@pytest.mark.slow  # (a timing: measured in bench/apply_parallel.py; in the CI tier, beside the other worker, it can only flake)
def test_a_hundred_creates_take_under_twice_the_time_of_one():
    """Issue 22 item 3's target, on the Compute Engine fake with 4 s operations (zoneOperations.wait blocks until
    DONE; a real insert takes tens of seconds): 100 creates in under 2x the time of one. Measured 1.76x at 2 s
    operations on this 2-core machine at load ~4 (the overhead of 100 inserts is CPU, hence the longer operations
    here); the sequential apply took 5 creates 4.95x the time of one."""
    from bench.apply_parallel import run

    one, _ = run(1, 4.0, None)
    hundred, most = run(100, 4.0, None)
    assert most >= 50  # they really overlapped
    assert hundred < 2 * one, (one, hundred)
