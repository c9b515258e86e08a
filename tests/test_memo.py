"""The plan memo (reconciler/memo.py, issue 20.3): `reconcile plan` reads back the plan it made for exactly the
same inputs. Each clock input has a test that fails if it were left out of the key: the key (or the plan) at two
moments that differ only in that input must differ, and at two moments that differ in none it must not."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

from typer.testing import CliRunner

from reconciler import api, memo
from reconciler.backend import backend_for
from reconciler.cli import app
from reconciler.observe import Fleet
from reconciler.problem import build_problem
from reconciler.runtime.publish import with_runtime
from reconciler.state import state_dir
from tests.fleetkit import QUICKSTART, doc, job, pool, tenant, topology, write_config

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".reconcile", "status"))
    return dst


def _inputs(cfg: Path):
    desired = api.load(cfg)
    backend = backend_for(cfg, None)
    observed = with_runtime(backend, desired, Fleet(desired, state_dir(cfg)).observe(backend.load()))
    return desired, observed


def _key(cfg: Path, now: datetime, desired=None, observed=None) -> str:
    d, o = _inputs(cfg)
    return memo.memo_key(cfg, desired or d, observed or o, now, {"provider": "sim"})


def test_a_second_plan_reads_back_the_same_plan_byte_for_byte(tmp_path):
    cfg = _copy(QUICKSTART, tmp_path / "q")
    first = api.plan_with_memo(cfg, time_limit=5, now=T0)
    again = api.plan_with_memo(cfg, time_limit=5, now=T0 + timedelta(seconds=30))
    assert (first.reused, again.reused) == (False, True)
    fresh = api.plan(cfg, time_limit=5, now=T0 + timedelta(seconds=30)).plan
    assert again.plan.to_json() == first.plan.to_json() == fresh.to_json()


def test_a_changed_config_is_solved_again(tmp_path):
    cfg = _copy(QUICKSTART, tmp_path / "q")
    api.plan_with_memo(cfg, time_limit=5, now=T0)
    f = cfg / "jobs" / "platform.yaml"
    f.write_text(f.read_text().replace("priority: low", "priority: high", 1))
    assert "priority: high" in f.read_text()
    res = api.plan_with_memo(cfg, time_limit=5, now=T0)
    assert not res.reused
    assert res.plan.to_json() == api.plan(cfg, time_limit=5, now=T0).plan.to_json()


def test_a_torn_edited_or_foreign_memo_is_ignored_and_rebuilt(tmp_path):
    cfg = _copy(QUICKSTART, tmp_path / "q")
    other = write_config(tmp_path / "other", [topology("other"), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"]),
                                              job("j", cpu=1)])
    good = api.plan_with_memo(cfg, time_limit=5, now=T0).plan.to_json()
    path = cfg / memo.MEMO_FILE
    sound = path.read_bytes()
    api.plan_with_memo(other, time_limit=5, now=T0)
    for broken in (sound[: len(sound) // 2],  # torn
                   sound.replace(b'"cost_after": ', b'"cost_after": 1', 1),  # edited: the checksum fails
                   (other / memo.MEMO_FILE).read_bytes(),  # another config's: another key
                   b"not json\n{}"):
        path.write_bytes(broken)
        res = api.plan_with_memo(cfg, time_limit=5, now=T0)
        assert not res.reused and res.plan.to_json() == good
        head, _, text = path.read_bytes().partition(b"\n")
        assert text == sound.partition(b"\n")[2] and json.loads(head)["key"] == json.loads(sound.partition(b"\n")[0])["key"]  # rewritten whole
    # A plan committed with a pull request, under the right key and a checksum anyone computes (the format trusted
    # before), saying "no change" for a config that changes the fleet, is not printed: only this machine's seal is read.
    from reconciler.plan import body_digest

    head, _, text = sound.partition(b"\n")
    raw = json.loads(text)
    raw["cost_after"] += 1000.0
    raw.pop("body_digest")
    raw["body_digest"] = body_digest(raw)  # as anyone can (tests/test_saved_plans.py)
    forged = json.dumps(raw).encode()
    key = json.loads(head)["key"]
    for entry in ({"key": key, "sum": hashlib.sha256(forged).hexdigest(), "seconds": 1.0},
                  {"key": key, "seal": hashlib.sha256(forged).hexdigest(), "seconds": 1.0}):
        path.write_bytes(json.dumps(entry).encode() + b"\n" + forged)
        res = api.plan_with_memo(cfg, time_limit=5, now=T0)
        assert not res.reused and res.plan.to_json() == good


def test_cli_plan_says_when_it_read_the_memo_and_no_memo_solves(tmp_path):
    cfg = _copy(QUICKSTART, tmp_path / "q")
    runner = CliRunner()
    one = runner.invoke(app, ["plan", str(cfg), "--format", "json", "--time-limit", "5"])
    two = runner.invoke(app, ["plan", str(cfg), "--format", "json", "--time-limit", "5"])
    three = runner.invoke(app, ["plan", str(cfg), "--format", "json", "--time-limit", "5", "--no-memo"])
    assert one.exit_code == two.exit_code == three.exit_code == 0, (one.output, two.output)
    assert one.stdout == two.stdout == three.stdout
    assert json.loads(two.output)["fleet"] == "quickstart"  # the JSON alone, also with stderr mixed in
    human = runner.invoke(app, ["plan", str(cfg), "--time-limit", "5"])
    assert "read back from .reconcile/cache/plan-memo.json" in human.stderr
    assert "plan-memo.json" not in runner.invoke(app, ["plan", str(cfg), "--time-limit", "5", "--no-memo"]).stderr


def test_a_plan_cut_short_by_the_wall_clock_is_not_kept(tmp_path):
    cfg = _copy(QUICKSTART, tmp_path / "q")
    made = api.plan(cfg, time_limit=5, now=T0).plan
    capped = replace(made, solver=replace(made.solver, status="GREEDY_FALLBACK"))
    assert not memo.keep(cfg, "k", capped, 1.0, time_limit=5)
    assert memo.keep(cfg, "k", capped, 1.0, time_limit=0)  # --time-limit 0 is greedy's plan every time
    assert memo.keep(cfg, "k", made, 1.0, time_limit=5)


# ---- the clock, input by input


def _aging_config(tmp_path: Path) -> Path:
    """One 1-GPU instance at most; a normal job and a low one submitted at T0 that ages one class an hour."""
    return write_config(tmp_path / "aging", [
        topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["g4dn.xlarge"], hi=1),
        doc("PlacementPolicy", "pp", {"aging": {"step_hours": 1, "max_priority": "high"}}),
        job("fresh", gpus=1, gpu_type="T4", cpu=2, mem=8, priority="normal"),
        job("waiting", gpus=1, gpu_type="T4", cpu=2, mem=8, priority="low", submitted=T0.isoformat()),
    ])


def test_aging_is_in_the_key_plan_by_plan(tmp_path):
    cfg = _aging_config(tmp_path)
    early = api.plan_with_memo(cfg, time_limit=5, now=T0 + timedelta(minutes=10))
    later = api.plan_with_memo(cfg, time_limit=5, now=T0 + timedelta(hours=3))  # low x1000 -> capped at high
    placed = lambda p: sorted(j.job for j in p.jobs if j.instances)  # noqa: E731
    assert placed(early.plan) == ["fresh"] and placed(later.plan) == ["waiting"]
    assert not later.reused
    assert api.plan_with_memo(cfg, time_limit=5, now=T0 + timedelta(minutes=20)).plan.to_json() != later.plan.to_json()
    # within one aging step the key holds: the memo serves it
    assert api.plan_with_memo(cfg, time_limit=5, now=T0 + timedelta(minutes=25)).reused


def test_aging_is_in_the_key(tmp_path):
    cfg = _aging_config(tmp_path)
    assert _key(cfg, T0 + timedelta(minutes=10)) == _key(cfg, T0 + timedelta(minutes=50))
    assert _key(cfg, T0 + timedelta(minutes=50)) != _key(cfg, T0 + timedelta(minutes=70))


def _due_config(tmp_path: Path, due: datetime) -> Path:
    return write_config(tmp_path / "due", [
        topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"]),
        job("due", cpu=1, expected_hours=4, deadline=due),
    ])


def test_deadline_ranks_are_in_the_key(tmp_path):
    """A pending job due at T0+10h that needs 4 h: deadline-critical (it may use more) from T0+2h on, when its
    latest start (T0+6h) is within its 4 hours; nothing else about it changes between T0+1h and T0+3h."""
    cfg = _due_config(tmp_path, T0 + timedelta(hours=10))
    assert _key(cfg, T0) == _key(cfg, T0 + timedelta(hours=1))
    assert _key(cfg, T0 + timedelta(hours=1)) != _key(cfg, T0 + timedelta(hours=3))


def test_deadline_conditions_are_in_the_key(tmp_path):
    """A running job past its expected hours (none left) and due in 10 h: DeadlineMissed only once the deadline
    itself has passed, 4 h after its rank lapsed (its latest start for 4 h of work): only its condition changes."""
    now = datetime.now(timezone.utc).replace(microsecond=0)
    cfg = _due_config(tmp_path, now + timedelta(hours=10))
    api.apply(cfg, time_limit=5)
    d, o = _inputs(cfg)
    assert o.placements.get("due")
    assert _key(cfg, now + timedelta(hours=9.2)) == _key(cfg, now + timedelta(hours=9.7))
    assert _key(cfg, now + timedelta(hours=9.7)) != _key(cfg, now + timedelta(hours=10.5))
    at = {h: memo.clock_inputs(d, o, now + timedelta(hours=h)) for h in (9.7, 10.5)}
    assert [at[h]["deadline_conditions"]["due"]["condition"] for h in (9.7, 10.5)] == ["DeadlineAtRisk", "DeadlineMissed"]


def test_reservations_in_force_are_in_the_key(tmp_path):
    cfg = write_config(tmp_path / "res", [
        topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"]),
        doc("Reservation", "ri", {"cloud": "aws", "region": "us-east-1", "zone": "us-east-1a", "instance_type": "m6i.4xlarge",
                                  "count": 1, "hourly_cost": 0.05, "until": T0 + timedelta(days=1)}),
        job("j", cpu=1),
    ])
    assert _key(cfg, T0) == _key(cfg, T0 + timedelta(hours=1))
    assert _key(cfg, T0 + timedelta(hours=1)) != _key(cfg, T0 + timedelta(days=2))


def _applied_quickstart(tmp_path: Path) -> Path:
    cfg = _copy(QUICKSTART, tmp_path / "q")
    api.apply(cfg, time_limit=5)
    return cfg


def test_running_jobs_hours_left_are_build_problems(tmp_path):
    cfg = _applied_quickstart(tmp_path)
    d, o = _inputs(cfg)
    now = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(hours=2)
    left = memo.running_hours_left(d, o, now)
    assert left and left == build_problem(d, o, "sim", now=now).job_remaining


def test_a_young_fleet_keys_the_same_from_one_second_to_the_next(tmp_path):
    """Running jobs are ranked by when they are expected to end, which the clock does not move, so an unchanged
    fleet whose jobs are within their expected_hours keys the same a second, an hour or a month later (before,
    its hours left were keyed and every plan solved again); the plan then is the same plan too."""
    cfg = _applied_quickstart(tmp_path)
    now = datetime.now(timezone.utc).replace(microsecond=0)
    keys = {_key(cfg, now + timedelta(seconds=s)) for s in (1, 2, 3600, 30 * 86400)}
    assert len(keys) == 1
    plans = {api.plan(cfg, time_limit=5, now=now + timedelta(seconds=s)).plan.to_json() for s in (1, 3600, 30 * 86400)}
    assert len(plans) == 1


def test_a_running_job_without_a_known_start_keys_the_time(tmp_path):
    """A running job whose instance reports no launch time counts as started now: its expected end moves with the
    clock, so the time is in the key."""
    cfg = _applied_quickstart(tmp_path)
    d, o = _inputs(cfg)
    o = replace(o, instances=tuple(replace(i, launched_at=None) for i in o.instances))
    now = datetime.now(timezone.utc).replace(microsecond=0)
    assert _key(cfg, now, d, o) != _key(cfg, now + timedelta(seconds=1), d, o)


def test_cool_offs_and_live_prices_are_in_the_key(tmp_path):
    """The observed fleet is keyed whole: a cool-off (read at the clock) or a new spot price changes the key."""
    cfg = _copy(QUICKSTART, tmp_path / "q")
    d, o = _inputs(cfg)
    base = _key(cfg, T0, d, o)
    first = o.offerings[0]
    cool = replace(o, short=frozenset({(first.offering.cloud, first.offering.zone, first.offering.instance_type, "spot")}))
    assert _key(cfg, T0, d, cool) != base
    spot = next(i for i, po in enumerate(o.offerings) if po.offering.spot_price)
    po = o.offerings[spot]
    repriced = replace(o, offerings=o.offerings[:spot] + (replace(po, offering=replace(po.offering, spot_price=po.offering.spot_price * 1.01)),)
                       + o.offerings[spot + 1:])
    assert _key(cfg, T0, d, repriced) != base
    assert _key(cfg, T0, d, o) == base


def test_options_and_the_catalog_are_in_the_key(tmp_path):
    cfg = _copy(QUICKSTART, tmp_path / "q")
    d, o = _inputs(cfg)
    keys = {memo.memo_key(cfg, d, o, T0, {"time_limit": t, "gap": g}) for t, g in ((5, None), (6, None), (5, 0.01))}
    assert len(keys) == 3
    before = memo.memo_key(cfg, d, o, T0, {})
    from providers.catalog import shipped_catalog_text

    (cfg / "catalog.json").write_text(shipped_catalog_text().replace('"', '"', 1) + "\n")
    assert memo.memo_key(cfg, d, o, T0, {}) != before


def test_a_memo_hit_prints_what_rendering_prints_and_a_bad_render_entry_is_rendered_again(tmp_path):
    """The printed plan is kept beside the memo (rendering 5,000 jobs takes 0.2 s): used only for the same key and
    format, and an edited one is ignored."""
    cfg = _copy(QUICKSTART, tmp_path / "q")
    runner = CliRunner()
    args = ["plan", str(cfg), "--time-limit", "5", "--format", "markdown"]
    runner.invoke(app, args)  # solves and keeps the plan
    first_hit = runner.invoke(app, args)  # renders the plan read back, and keeps that text
    hit = api.plan_with_memo(cfg, time_limit=5, gap=0.03)  # the CLI's default --gap
    assert hit.reused
    from reconciler.render import render

    assert first_hit.stdout == render(hit.plan, "markdown")
    variant = json.dumps(["markdown", False, None])
    assert memo.read_render(cfg, hit.key, variant) == first_hit.stdout
    assert memo.read_render(cfg, hit.key, json.dumps(["human", False, None])) is None
    entry = json.loads((cfg / memo.RENDER_FILE).read_text())
    (cfg / memo.RENDER_FILE).write_text(json.dumps({**entry, "text": entry["text"].replace("quickstart", "elsewhere")}))
    assert memo.read_render(cfg, hit.key, variant) is None
    assert runner.invoke(app, args).stdout == first_hit.stdout
    assert runner.invoke(app, args[:-2]).stdout == render(hit.plan, "human")  # another format: rendered, not the markdown


def _views(cfg: Path):
    """Two reports of the same live fleet a heartbeat apart: new heartbeats, log lines and run times."""
    from reconciler.runtime.lifecycle import JobRun, RuntimeView

    d, o = _inputs(cfg)
    iids = sorted(i.id for i in o.instances)
    runs = {n: JobRun(n, "Running", "Started", "", started_at="2026-03-01T12:00:00+00:00", log_tail=(f"{n}: step 1",))
            for n in sorted(o.placements)}
    a = RuntimeView(jobs=runs, heartbeats={i: 1000.0 for i in iids})
    b = RuntimeView(jobs={n: replace(r, log_tail=(f"{n}: step 1", f"{n}: step 2")) for n, r in runs.items()},
                    heartbeats={i: 1030.0 for i in iids})
    return d, o, a, b


def test_live_agents_heartbeats_and_logs_are_not_in_the_key_what_planning_reads_is(tmp_path):
    """Agents report every few seconds (heartbeats, log tails): keying their whole report made every plan of a
    fleet whose agents are alive solve again (a no-change PR plan of the applied 5k fleet: 9.4 s instead of a memo
    read). The key holds what planning reads of them: a finished job, an instance to replace."""
    cfg = _applied_quickstart(tmp_path)
    d, o, a, b = _views(cfg)
    now = datetime.now(timezone.utc).replace(microsecond=0)
    key_a, key_b = _key(cfg, now, d, replace(o, runtime=a)), _key(cfg, now, d, replace(o, runtime=b))
    assert key_a == key_b
    job, iid = min(o.placements), min(i.id for i in o.instances)
    assert _key(cfg, now, d, replace(o, runtime=replace(b, finished={job: "Succeeded"}))) != key_a
    assert _key(cfg, now, d, replace(o, runtime=replace(b, unhealthy={iid: "its agent stopped 40s ago"}))) != key_a


def test_what_the_key_leaves_out_of_the_agents_reports_does_not_change_the_plan(tmp_path):
    """The other half of the claim above: planning with either report gives the same plan, byte for byte (a
    planner that came to read heartbeats or logs would fail here, and the memo would have to key them)."""
    cfg = _applied_quickstart(tmp_path)
    d, o, a, b = _views(cfg)
    now = datetime.now(timezone.utc).replace(microsecond=0)
    plans = {api._plan(d, replace(o, runtime=v), "sim", 5, None, now, None).plan.to_json() for v in (a, b)}
    assert len(plans) == 1


def test_a_memo_hit_exits_as_its_plan_does_and_parses_the_plan_only_when_asked(tmp_path):
    """A hit keeps whether the plan changes anything beside it (under the seal), so `plan --detailed-exitcode`
    exits 2 or 0 as the plan does without parsing 5,000 jobs; `.plan` parses it, the same plan byte for byte."""
    runner = CliRunner()
    fresh = _copy(QUICKSTART, tmp_path / "fresh")  # nothing applied: the plan creates instances
    applied = _applied_quickstart(tmp_path / "a")  # applied: the plan is a no-op
    for cfg, code in ((fresh, 2), (applied, 0)):
        args = ["plan", str(cfg), "--time-limit", "5", "--detailed-exitcode", "--format", "json"]
        assert [runner.invoke(app, args).exit_code for _ in range(2)] == [code, code]
        res = api.plan_with_memo(cfg, time_limit=5, gap=0.03)
        assert res.reused and isinstance(res.made, memo.Hit) and "plan" not in vars(res.made)
        assert res.has_changes is (code == 2) is res.plan.has_changes
        assert res.plan.to_json() == api.plan(cfg, time_limit=5, gap=0.03).plan.to_json()
    # what the hit says without the plan is sealed with it: an entry saying "no changes" for a plan with changes
    path = fresh / memo.MEMO_FILE
    head, _, text = path.read_bytes().partition(b"\n")
    entry = json.loads(head)
    assert entry["has_changes"] is True
    path.write_bytes(json.dumps({**entry, "has_changes": False}).encode() + b"\n" + text)
    assert not api.plan_with_memo(fresh, time_limit=5, gap=0.03).reused
    assert runner.invoke(app, ["plan", str(fresh), "--time-limit", "5", "--detailed-exitcode"]).exit_code == 2


def test_a_memo_hit_imports_neither_the_planner_nor_rich_and_exits_with_all_printed(tmp_path):
    """A plan read back from the memo prints the kept text: it imports no solver, planner, apply or rich (issue 20.3:
    0.04 s of CPU of a 0.6 s no-change plan), and `reconcile` ends the process without the interpreter's teardown
    (reconciler/cli.py) once all is printed: the output is whole and the exit code is the plan's."""
    import subprocess
    import sys

    cfg = _copy(QUICKSTART, tmp_path / "q")
    args = ["plan", str(cfg), "--time-limit", "5", "--detailed-exitcode"]
    for _ in range(2):  # solved and kept, then read back and its render kept
        assert CliRunner().invoke(app, args).exit_code == 2
    code = ("import sys; from typer.testing import CliRunner; from reconciler.cli import app; "
            f"r = CliRunner().invoke(app, {args!r}); assert r.exit_code == 2, r.output; "
            "assert 'read back' in r.stderr, r.stderr; "
            "print(sorted(m for m in ('ortools', 'rich', 'reconciler.plan', 'reconciler.apply', 'policies.guardrails', "
            "'reconciler.render', 'reconciler.status') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    want = api.plan_with_memo(cfg, time_limit=5, gap=0.03).plan  # as read back (no solve time in it)
    from reconciler.render import render

    main = ("import sys; from reconciler.cli import main; sys.argv = ['reconcile'] + sys.argv[1:]; main(); "
            "print('not reached: main() ends the process')")
    for fmt in ("human", "json"):
        run = subprocess.run([sys.executable, "-c", main, *args, "--format", fmt], capture_output=True, text=True, timeout=300)
        assert run.returncode == 2, run.stderr
        assert run.stdout == render(want, fmt), fmt


def test_the_first_plan_keeps_what_the_next_one_prints_and_only_for_a_plan_it_kept(tmp_path, monkeypatch):
    """A solve renders, beside its own output, the plan as the memo will give it back (no solve time in it), so
    the first re-plan of the same inputs reads it instead of rendering with rich; a plan that was not kept keeps
    no render either (another plan kept later under that key would be printed with this one's text)."""
    from reconciler.render import render

    cfg = _copy(QUICKSTART, tmp_path / "q")
    runner = CliRunner()
    args = ["plan", str(cfg), "--time-limit", "5"]
    solved = runner.invoke(app, args)
    assert "read back" not in solved.stderr
    hit = api.plan_with_memo(cfg, time_limit=5, gap=0.03)
    variant = json.dumps(["human", False, None])
    assert memo.read_render(cfg, hit.key, variant) == render(hit.plan, "human") != solved.stdout  # no "in 0.04s"
    again = runner.invoke(app, args)
    assert "read back" in again.stderr and again.stdout == render(hit.plan, "human")
    other = _copy(QUICKSTART, tmp_path / "o")
    monkeypatch.setattr(memo, "keep", lambda *a, **k: False)
    runner.invoke(app, ["plan", str(other), "--time-limit", "5"])
    assert not (other / memo.RENDER_FILE).exists()
